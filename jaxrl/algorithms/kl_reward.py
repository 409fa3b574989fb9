"""KL to the reference policy as a reward penalty (`algorithm.kl.where: reward`, PPO-style).

    r_KL,i = −β Σ_t m_it k(log π_old(y_it), log π_ref(y_it))

added as one more reward column of weight 1, so scalar-reward estimators (GRPO, RLOO, ...) see R_i + r_KL,i.
With a critic (PPO) it is a per-token reward instead, r_it −= β m_it k_it (`token_rewards`), as in verl.
GDPO / GD²PO normalise each column within its group, which would erase β; the config refuses that pairing
(`Algorithm.per_reward`).
"""

from __future__ import annotations

import functools

import jax
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
        kl_B = self._kl_BT(ro).sum(axis=1)
        return -self.beta * kl_B, {"kl": float(kl_B.mean())}

    def token_rewards(self, ro) -> tuple[np.ndarray, dict[str, float]]:
        """The penalty on each completion token, −β m_t k_t (all hosts' rows), where a critic's GAE reads
        it (PPO, `jaxrl.rl.critic.ActorCritic`; verl's `apply_kl_penalty`): a token's KL enters the returns
        of that token and the ones before it, not of every token of the row."""
        kl_BT = self._kl_BT(ro)
        return (-self.beta * kl_BT).astype(np.float32), {"kl": float(kl_BT.sum(axis=1).mean())}

    def _kl_BT(self, ro) -> np.ndarray:
        """m_t k_t of every row (all hosts' rows, on every host)."""
        ref_BT = self.run.logprob_fn(self.run.policy.reference, ro.tokens_BL, ro.mask_BL,
                                     ro.completion_mask_BT.shape[1])
        return hosts.to_host(_masked_kl_BT(ro.old_logp_BT, ref_BT, ro.completion_mask_BT, kind=self.kind))

    def actor_frozen(self, step: int) -> bool:
        return False

    def state_json(self):
        return None

    def load_state(self, data) -> None:
        pass


@functools.partial(jax.jit, static_argnames="kind")
def _masked_kl_BT(old_BT, ref_BT, mask_BT, *, kind: losses.KLKind):
    """k(log π_old, log π_ref) on the completion tokens, 0 elsewhere (one program: eager jnp on arrays that
    span several processes runs each op as its own program)."""
    return jnp.where(mask_BT, losses.kl_penalty(old_BT, ref_BT, kind), 0.0)
