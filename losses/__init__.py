"""jaxrl.losses: pure, jit-able RL post-training objectives, advantage estimators and aggregators.

Dimension key (shape suffixes on every tensor name):
  B  rows: sequences, B = P x G, groups contiguous T  completion tokens (padded width)
  P  prompts                                        G  group size (samples per prompt)
  R  reward columns (components)                    D  model dim
  V  vocabulary                                     C  vocabulary chunk
(The letters of `jaxrl.types` and docs/DESIGN.md; DIR's pair losses in `dir.py` keep their own key.)

Conventions:
* Functions take arrays and small frozen configs or keyword scalars, never a model or the experiment config.
* Three kinds of function: advantage estimators (rewards_B -> adv_B), per-token objectives (-> loss_BT, or
  (loss, metrics) after aggregation), and aggregators ((values_BT, mask_BT, mode) -> scalar).
* Every loss returns `(scalar, metrics)`; metrics is a flat dict of scalar arrays with slash-namespaced keys
  (`pg/clip_frac`, `kl/k3`, `entropy/mean`).
* mask_BT: 1 = real token that is trained on. Values at masked positions never reach a loss or a gradient.
* std means the unbiased (n - 1) standard deviation, as in verl and TRL.
* Shapes are asserted with chex at the entry of every public function (at trace time, free at run time).
"""

from jaxrl.losses.advantages import dynamic_sampling_mask, group_advantages, rloo_advantages
from jaxrl.losses.aggregation import AggMode, aggregate, aggregation_normalizer, as_agg_mode, masked_mean
from jaxrl.losses.grpo import ClipConfig, clipped_objective, entropy_bonus, log_ratio, policy_loss
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

# Part B methods used by the trainer or the reward-model trainer (CLIPO, DIR, OpenRS, AFRL/SFT). The seed
# papers' reward arithmetic that no pipeline uses yet (EVPV, Proxy-GRM, MARCH, SSP, multi-reward weighting)
# lives in `jaxrl.losses.research`.
from jaxrl.losses.clipo import (
    ContrastiveHeadConfig,
    apply_contrastive_head,
    clipo_head_loss,
    contrastive_bonus,
    contrastive_loss,
    init_contrastive_head,
    mean_pool,
)
from jaxrl.losses.dir import (
    apply_club_classifier,
    REFERENCE_GAMMA,
    bradley_terry_loss,
    classifier_inner_steps,
    classifier_micro_steps,
    club_classifier_nll,
    club_mi,
    club_mi_micro,
    dir_loss,
    infonce_mi_lower_bound,
    init_club_classifier,
    length_attribute,
    pair_representation,
    reference_gamma,
)
from jaxrl.losses.openrs import (
    Criterion,
    bidirectional_verdict,
    pair_score,
    pairwise_group_rewards,
    reference_rewards,
    score_matrix,
)
from jaxrl.losses.sft import (
    mode_balanced_loss,
    sft_nll,
)

# Issue 15: GSPO, CISPO, SAPO objectives, train-inference mismatch correction, pass@k / avg@k.
from jaxrl.losses.cispo import CISPOConfig, cispo_loss, cispo_objective
from jaxrl.losses.gspo import gspo_loss, gspo_objective, sequence_log_ratio
from jaxrl.losses.mismatch import mismatch_metrics, rollout_correction
from jaxrl.losses.passk import avg_at_k, pass_at_k, pass_at_k_per_problem
from jaxrl.losses.sapo import sapo_loss, sapo_objective
# Issue 28: REINFORCE++ and REINFORCE++-baseline.
from jaxrl.losses.reinforce_pp import reinforce_pp_advantages, reinforce_pp_baseline_advantages
# PPO critic: GAE and the clipped value loss.
from jaxrl.losses.gae import gae_advantages, outcome_token_rewards, value_loss

__all__ = [
    "AggMode",
    "ClipConfig",
    "ContrastiveHeadConfig",
    "Criterion",
    "DAPOConfig",
    "ETRConfig",
    "KLKind",
    "aggregate",
    "aggregation_normalizer",
    "apply_club_classifier",
    "apply_contrastive_head",
    "as_agg_mode",
    "bidirectional_verdict",
    "bradley_terry_loss",
    "classifier_inner_steps",
    "clipo_head_loss",
    "clipped_objective",
    "club_classifier_nll",
    "club_mi",
    "contrastive_bonus",
    "contrastive_loss",
    "dir_loss",
    "dynamic_sampling_mask",
    "entropy_bonus",
    "etr_clip_bounds",
    "etr_policy_loss",
    "gd2po_advantages",
    "gdpo_advantages",
    "gdpo_token_advantages",
    "group_advantages",
    "group_reward_std",
    "infonce_mi_lower_bound",
    "init_club_classifier",
    "init_contrastive_head",
    "kl_loss",
    "kl_penalty",
    "length_attribute",
    "log_ratio",
    "macro_factor",
    "masked_mean",
    "masked_whiten",
    "mean_pool",
    "micro_factor",
    "mode_balanced_loss",
    "overlong_penalty",
    "overlong_shaped_rewards",
    "pair_representation",
    "pair_score",
    "pairwise_group_rewards",
    "policy_loss",
    "reference_rewards",
    "rloo_advantages",
    "score_matrix",
    "sft_nll",
    "token_logprobs_and_entropy",
    "CISPOConfig",
    "cispo_loss",
    "cispo_objective",
    "gspo_loss",
    "gspo_objective",
    "sequence_log_ratio",
    "mismatch_metrics",
    "rollout_correction",
    "avg_at_k",
    "pass_at_k",
    "pass_at_k_per_problem",
    "sapo_loss",
    "sapo_objective",
    "REFERENCE_GAMMA",
    "classifier_micro_steps",
    "club_mi_micro",
    "reference_gamma",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "gae_advantages",
    "outcome_token_rewards",
    "value_loss",
]
