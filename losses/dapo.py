"""DAPO pieces: clip-higher defaults and overlong reward shaping (DAPO, Yu et al., arXiv:2503.14476).

The dynamic-sampling group filter is `jaxrl.losses.advantages.dynamic_sampling_mask`; the loss itself is
`jaxrl.losses.grpo.policy_loss` with `DAPOConfig.clip()` and token-mean aggregation.

Deviations / choices:
* The overlong penalty is not clamped below at -factor for lengths past `max_length` (verl's DAPO reward
  manager does not clamp either; generation normally stops at max_length).
"""

import dataclasses

import chex
import jax.numpy as jnp

from jaxrl.losses.grpo import ClipConfig


@dataclasses.dataclass(frozen=True)
class DAPOConfig:
    """DAPO recipe defaults.

    clip_low / clip_high: eps_low / eps_high ("clip-higher"); dual_clip: c (verl clip_ratio_c in the DAPO
    recipe); agg: token-level loss; overlong_max_length L_max, overlong_buffer L_buf, overlong_factor kappa
    (spec 1.5).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0
    agg: str = "token-mean"
    overlong_max_length: int = 8192
    overlong_buffer: int = 4096
    overlong_factor: float = 1.0

    def __post_init__(self):
        if not 0 < self.overlong_buffer <= self.overlong_max_length:
            raise ValueError(
                f"DAPOConfig.overlong_buffer must be in (0, overlong_max_length={self.overlong_max_length}], "
                f"got {self.overlong_buffer}"
            )
        self.clip()  # validates the clip bounds

    def clip(self) -> ClipConfig:
        return ClipConfig(clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip)


def overlong_penalty(
    lengths_B: chex.Array, *, max_length: int, buffer: int, factor: float = 1.0
) -> chex.Array:
    """Soft overlong punishment added to the task reward.

    r_len_i = min(-(L_i - (L_max - L_buf)) / L_buf * kappa, 0)
    i.e. 0 up to L_max - L_buf tokens, then linearly down to -kappa at L_max.

    Args:
      lengths_B: [B] int or float response lengths L_i (valid tokens, EOS included).
      max_length: L_max.  buffer: L_buf in (0, L_max].  factor: kappa.

    Returns:
      [B] float32 penalties (<= 0).
    """
    chex.assert_rank(lengths_B, 1)
    if not 0 < buffer <= max_length:
        raise ValueError(f"buffer must be in (0, max_length={max_length}], got {buffer}")
    exceed_B = lengths_B.astype(jnp.float32) - (max_length - buffer)
    return jnp.minimum(-exceed_B / buffer * factor, 0.0)


def overlong_shaped_rewards(rewards_B: chex.Array, lengths_B: chex.Array, cfg: DAPOConfig) -> chex.Array:
    """rewards_B + overlong_penalty(lengths_B) with the config's L_max, L_buf, kappa."""
    chex.assert_equal_shape([rewards_B, lengths_B])
    return rewards_B + overlong_penalty(
        lengths_B, max_length=cfg.overlong_max_length, buffer=cfg.overlong_buffer, factor=cfg.overlong_factor
    )
