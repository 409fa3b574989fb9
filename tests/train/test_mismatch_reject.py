"""`mismatch.reject` reaches the trainer: under MIS, `mask` (verl) drops rejected tokens from the batch's
completion mask, `zero_weight` (TRL) keeps them in the mask with importance weight 0."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.rl import batch as rl_batch, run as rl_run
from jaxrl.config import load_config
from jaxrl.learner.train_step import TrainBatch


def _batch() -> tuple[TrainBatch, jnp.ndarray]:
    B, W, T = 2, 2, 3
    old_BT = jnp.zeros((B, T), jnp.float32)
    sampler_BT = jnp.array([[0.0, -2.0, 0.0], [0.0, 0.0, 0.0]], jnp.float32)  # ratio e^2 > upper 2: rejected
    batch = TrainBatch(tokens_BL=jnp.ones((B, W + T), jnp.int32), mask_BL=jnp.ones((B, W + T), bool),
                       completion_mask_BT=jnp.ones((B, T), bool), old_logp_BT=old_BT,
                       ref_logp_BT=jnp.zeros((B, T)), adv_BT=jnp.ones((B, T)), clip_low_B=jnp.full((B,), 0.2),
                       clip_high_B=jnp.full((B,), 0.2), sft_weight_B=jnp.zeros((B,)))
    return batch, sampler_BT


@pytest.mark.parametrize("reject", ["mask", "zero_weight"])
def test_reject_rule_reaches_the_batch(reject):
    batch, sampler_BT = _batch()
    run = types.SimpleNamespace(mismatch=rl_run.MismatchSpec("mis", "token", None, 2.0, reject))
    out, _ = rl_batch._mismatch(run, batch, sampler_BT, n_rollout=2)
    mask = np.asarray(out.completion_mask_BT)
    weights = np.asarray(out.is_weight_BT)
    assert weights[0, 1] == 0.0 or not mask[0, 1]
    if reject == "mask":
        assert not mask[0, 1] and mask.sum() == 5
    else:
        assert mask.all() and weights[0, 1] == 0.0
    assert np.all(weights[1] == 1.0) and mask[1].all()


def test_config_value_reaches_the_run_spec():
    cfg = load_config(None, ["algorithm.mismatch.mode=mis", "algorithm.mismatch.reject=zero_weight"])
    assert rl_run.MismatchSpec.from_config(cfg.algorithm.mismatch) == rl_run.MismatchSpec(
        "mis", "token", None, 2.0, "zero_weight")
