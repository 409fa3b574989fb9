"""jaxrl.losses: pure, jit-able RL post-training objectives."""
