"""The one optimiser builder of jaxrl: `OptimizerConfig` -> optax transformation (RL and reward models)."""

from __future__ import annotations

import optax


def build_optimizer(cfg, total_steps: int) -> optax.GradientTransformation:
    """AdamW with linear warm-up, then constant or cosine decay to `lr * final_lr_frac`, after a global-norm
    clip (none when `clip_norm` is null).

    Args:
      cfg: a `jaxrl.config.OptimizerConfig` (lr, b1, b2, eps, weight_decay, warmup_steps, schedule,
        final_lr_frac, clip_norm).
      total_steps: optimiser steps of the run; the cosine decays over the steps after the warm-up.
    """
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    if cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=cfg.final_lr_frac)
    else:
        after = optax.constant_schedule(cfg.lr)
    schedule = optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), after],
                                    [cfg.warmup_steps]) if cfg.warmup_steps else after
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw) if cfg.clip_norm else adamw
