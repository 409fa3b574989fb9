"""jaxrl.losses: pure, jit-able RL post-training objectives, advantage estimators and aggregators.

Dimension key (shape suffixes on every tensor name):
  B  batch of sequences (prompts x samples)       T  completion tokens (padded width)
  N  samples, N = P x G, groups contiguous         G  group size (samples per prompt)
  P  prompts                                        K  reward components (also written R in the design doc)
  D  model dim                                      V  vocabulary
  C  vocabulary chunk

Conventions:
* Functions take arrays and small frozen configs or keyword scalars, never a model or the experiment config.
* Three kinds of function: advantage estimators (rewards_N -> adv_N), per-token objectives (-> loss_BT, or
  (loss, metrics) after aggregation), and aggregators ((values_BT, mask_BT, mode) -> scalar).
* Every loss returns `(scalar, metrics)`; metrics is a flat dict of scalar arrays with slash-namespaced keys
  (`pg/clip_frac`, `kl/k3`, `entropy/mean`).
* mask_BT: 1 = real token that is trained on. Values at masked positions never reach a loss or a gradient.
* std means the unbiased (n - 1) standard deviation, as in verl and TRL.
* Shapes are asserted with chex at the entry of every public function (at trace time, free at run time).
"""

from jaxrl.losses.advantages import dynamic_sampling_mask, group_advantages, rloo_advantages
from jaxrl.losses.aggregation import AggMode, aggregate, aggregation_normalizer, as_agg_mode, masked_mean
from jaxrl.losses.grpo import ClipConfig, entropy_bonus, log_ratio, policy_loss
from jaxrl.losses.dapo import DAPOConfig, overlong_penalty, overlong_shaped_rewards
from jaxrl.losses.etr import (
    ETRConfig,
    etr_clip_bounds,
    etr_policy_loss,
    group_reward_std,
    macro_factor,
    micro_factor,
)
from jaxrl.losses.gdpo import gd2po_advantages, gdpo_advantages, gdpo_token_advantages, masked_whiten
from jaxrl.losses.kl import KLKind, kl_loss, kl_penalty
from jaxrl.losses.logprobs import token_logprobs_and_entropy
from jaxrl.losses.multi_reward import (
    RewardStats,
    combine_rewards,
    redundancy_factor,
    reference_frozen_normalize,
    reference_stats,
    risk_factor,
    tri_factor_weights,
    weakness_factor,
    weighted_sum,
)

__all__ = [
    "AggMode",
    "ClipConfig",
    "DAPOConfig",
    "ETRConfig",
    "KLKind",
    "RewardStats",
    "aggregate",
    "aggregation_normalizer",
    "as_agg_mode",
    "combine_rewards",
    "dynamic_sampling_mask",
    "entropy_bonus",
    "etr_clip_bounds",
    "etr_policy_loss",
    "gd2po_advantages",
    "gdpo_advantages",
    "gdpo_token_advantages",
    "group_reward_std",
    "group_advantages",
    "kl_loss",
    "kl_penalty",
    "log_ratio",
    "macro_factor",
    "masked_mean",
    "masked_whiten",
    "micro_factor",
    "overlong_penalty",
    "overlong_shaped_rewards",
    "policy_loss",
    "redundancy_factor",
    "reference_frozen_normalize",
    "reference_stats",
    "risk_factor",
    "rloo_advantages",
    "token_logprobs_and_entropy",
    "tri_factor_weights",
    "weakness_factor",
    "weighted_sum",
]
