"""KL to the reference policy as a reward penalty (`algorithm.kl.where: reward`, PPO-style).

    r_KL,i = −β Σ_t m_it k(log π_old(y_it), log π_ref(y_it))

added as one more reward column of weight 1, so scalar-reward estimators (GRPO, RLOO, ...) see R_i + r_KL,i.
GDPO / GD²PO normalise each column within its group, which would erase β; the config refuses that pairing
(`Algorithm.per_reward`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrl import losses
from jaxrl.sharding import hosts


class KLRewardPenalty:
    """Shaping stage: the sequence KL of each rollout to the reference, times −β."""

    name = "kl_penalty"

    def __init__(self, run, beta: float, kind: losses.KLKind):
        self.run, self.beta, self.kind = run, beta, kind

    def __call__(self, params, ro, key) -> tuple[np.ndarray, dict[str, float]]:
        del params, key
        ref_BT = self.run.logprob_fn(self.run.policy.reference, ro.tokens_BL, ro.mask_BL,
                                     ro.completion_mask_BT.shape[1])
        kl_BT = losses.kl_penalty(jnp.asarray(ro.old_logp_BT), ref_BT, self.kind)
        kl_N = hosts.to_host(jnp.sum(jnp.where(ro.completion_mask_BT, kl_BT, 0.0), axis=1))  # all hosts' rows
        return -self.beta * kl_N, {"kl": float(kl_N.mean())}

    def actor_frozen(self, step: int) -> bool:
        return False

    def state_json(self):
        return None

    def load_state(self, data) -> None:
        pass
