"""The `overlong` reward is DAPO's soft overlong punishment, the same function as the loss-side one."""

import numpy as np

from jaxrl import losses
from jaxrl.rewards import overlong_penalty


def _reference(lengths, max_len, buffer, factor):
    """float64 DAPO eq. 13 (spec 1.5): min(-(L - (L_max - L_buf)) / L_buf * kappa, 0), no lower clamp."""
    lengths = np.asarray(lengths, np.float64)
    return np.minimum(-(lengths - (max_len - buffer)) / buffer * factor, 0.0)


def test_overlong_reward_matches_reference_and_losses():
    lengths = np.random.default_rng(0).integers(0, 1300, size=64).tolist() + [767, 768, 769, 1024, 1025]
    got = overlong_penalty([""] * len(lengths), [""] * len(lengths), completion_length=lengths, max_len=1024,
                           buffer=256, factor=0.5)
    np.testing.assert_allclose(got, _reference(lengths, 1024, 256, 0.5), rtol=1e-6, atol=1e-7)
    loss_side = losses.overlong_penalty(np.asarray(lengths), max_length=1024, buffer=256, factor=0.5)
    np.testing.assert_array_equal(np.float32(got), np.asarray(loss_side))
    assert got[-1] < -0.5  # past L_max the penalty keeps growing (not clamped at -kappa)
