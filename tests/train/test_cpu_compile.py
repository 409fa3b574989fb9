"""`jaxrl.learner.cpu_compile`: XLA:CPU programs keep YNNPACK's dot fusion unless a fusion pads a dot's result
and reuses it (the pattern jaxlib 0.10.2 segfaults on), in which case that signature runs without YNNPACK."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.learner.cpu_compile import NO_YNN, YNN_DOT, cpu_jit, unsafe_ynn_fusions

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU compiler options")


def _pad_then_add(a_MK, b_KN, c_PN):
    """dot -> pad -> add: the crashing fusion (at 128 x 128 x 32 padded to 1152 rows it segfaulted here)."""
    return jnp.pad(a_MK @ b_KN, ((0, c_PN.shape[0] - a_MK.shape[0]), (0, 0))) + c_PN


def _pad_at_root(a_MK, b_KN, c_PN):
    """dot -> pad as the fusion's result (every unshared update's loss gradient has one): runs correctly."""
    return jnp.pad(a_MK @ b_KN, ((0, c_PN.shape[0] - a_MK.shape[0]), (0, 0)))


def _inputs(rows=128, padded=1152):
    rng = np.random.default_rng(0)
    return tuple(rng.normal(size=s).astype(np.float32) for s in [(rows, 128), (128, 32), (padded, 32)])


def test_the_scan_finds_a_reused_pad_in_a_ynn_fusion_and_nothing_else():
    """The optimised program of dot -> pad -> add under the dot fusion has a YNNPACK fusion the scan names;
    a pad at the fusion's root, and the same program without YNNPACK, have none."""
    args = _inputs()
    compiled = lambda f, opts: jax.jit(f, compiler_options=opts).lower(*args).compile().as_text()
    hlo = compiled(_pad_then_add, YNN_DOT)
    assert '"__ynn_fusion"' in hlo and len(unsafe_ynn_fusions(hlo)) == 1
    root = compiled(_pad_at_root, YNN_DOT)
    assert '"__ynn_fusion"' in root and " pad(" in root and unsafe_ynn_fusions(root) == []
    assert unsafe_ynn_fusions(compiled(_pad_then_add, NO_YNN)) == []


def test_cpu_jit_runs_the_unsafe_signature_without_ynnpack(capfd):
    """At the shape that crashed, `cpu_jit` picks the program without YNNPACK (saying so once), whose values are
    XLA's; the safe function keeps the fast program; each signature is decided once."""
    args = _inputs()
    guarded = cpu_jit(_pad_then_add)
    assert guarded.uses_ynn(*args) is False
    np.testing.assert_array_equal(guarded(*args), jax.jit(_pad_then_add, compiler_options=NO_YNN)(*args))
    assert guarded(*args).shape == (1152, 32)
    assert capfd.readouterr().err.count("compiled without YNNPACK") == 1
    fast = cpu_jit(_pad_at_root)
    assert fast.uses_ynn(*args) is True
    np.testing.assert_allclose(fast(*args), _pad_at_root(*args), rtol=1e-5, atol=1e-5)
    other = _inputs(rows=128, padded=1024 + 256)
    assert guarded.uses_ynn(*other) is False and len(guarded._uses_fast) == 2  # a new signature, decided anew


def test_cpu_jit_is_plain_jit_elsewhere():
    """Other backends get `jax.jit` itself (their compiler knows no YNNPACK option)."""
    assert isinstance(cpu_jit(_pad_at_root, backend="gpu"), type(jax.jit(_pad_at_root)))
