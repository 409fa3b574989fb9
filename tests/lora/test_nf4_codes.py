"""NF4 codes by binary search over the level midpoints equal the nearest-level argmin (the definition)."""

import jax.numpy as jnp
import numpy as np

from jaxrl.models import quant


def _argmin_codes(w_YIO: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The definition in numpy: per block of `block` inputs of one output channel, the nearest NF4 level
    of W / max|W| (argmin over the 16 levels, float32 as the library computes it)."""
    y, i, o = w_YIO.shape
    w = w_YIO.transpose(0, 2, 1).reshape(y, o, i // block, block).astype(np.float32)
    absmax = np.abs(w).max(-1)
    safe = np.where(absmax > 0, absmax, np.float32(1.0))
    dist = np.abs(w[..., None] / safe[..., None, None] - quant.nf4_levels())
    return dist.argmin(-1).reshape(y, o, i), safe


def _unpack(q: quant.QuantizedKernel) -> np.ndarray:
    codes = np.asarray(q.codes)
    return np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(codes.shape[:-1] + (-1,))


def test_nf4_codes_equal_the_argmin_definition():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 128, 24)).astype(np.float32)
    w[1, :64, 5] = 0.0  # an all-zero block: scale 1, every code the level 0
    w[2, 64:, 7] = np.float32(3.5)  # a constant block: every entry at level +1
    q = quant.quantize(jnp.asarray(w), 1, "nf4", block=64)
    want, safe = _argmin_codes(w, 64)
    np.testing.assert_array_equal(_unpack(q), want)
    np.testing.assert_array_equal(np.asarray(q.scale), safe)
    levels = quant.nf4_levels()
    assert _unpack(q)[1, 5, 0] == int(np.argmin(np.abs(levels))) and _unpack(q)[2, 7, 64] == 15


def test_nearest_level_on_midpoints_and_extremes():
    levels = quant.nf4_levels()
    mids = (levels[1:] + levels[:-1]) / 2
    x = np.concatenate([levels, mids, [-1.0, 1.0, -2.0, 2.0]]).astype(np.float32)
    got = np.asarray(quant.nearest_level(jnp.asarray(x), levels))
    dist = np.abs(x[:, None] - levels[None, :])
    best = dist.min(-1)
    assert np.all(dist[np.arange(x.size), got] <= best + 1e-7)  # a nearest level (ties within rounding)
    np.testing.assert_array_equal(got[:16], np.arange(16))  # each level maps to itself
    np.testing.assert_array_equal(got[16:31], np.arange(15))  # an exact midpoint goes to the lower level
    np.testing.assert_array_equal(got[-4:], [0, 15, 0, 15])
