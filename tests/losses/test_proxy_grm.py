"""Proxy-GRM reward (spec 7d)."""

import itertools

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses.research import proxy_grm


def _py_reward(acc, proxy, fmt, fb):
    """Branch-by-branch reading of the reference compute_score (use_api=1, use_format=1)."""
    if fb == 1:
        if proxy == -1 and acc == 1:
            acc = -1
        elif proxy == 1 and acc == -1:
            acc, proxy = -1, -1
    elif fb == 2:
        if proxy == -1 and acc == 1:
            acc = -1
        proxy = 0
    elif fb >= 3:
        base = fb - 4 if fb >= 7 else fb
        hi = 1.0 if base == 6 else 1.5
        if acc == 1:
            acc = hi if proxy == 1 else 0.5
        else:
            acc = {3: (-1, -1), 4: (-1.5, -1), 5: (-1.5, -2), 6: (-1, -1)}[base][0 if proxy == 1 else 1]
        if fb >= 7:
            proxy = 0
    return acc + proxy + 0.5 * fmt


def test_spec_example():
    np.testing.assert_allclose(proxy_grm.proxy_grm_reward(1, -1, 1), 0.5)


def test_fb3_and_fb7_couplings():
    acc, proxy, fmt = jnp.array([1, 1, -1, -1]), jnp.array([1, -1, 1, -1]), jnp.ones(4)
    np.testing.assert_allclose(proxy_grm.proxy_grm_reward(acc, proxy, fmt, use_fb=3), [3.0, 0.0, 0.5, -1.5])
    np.testing.assert_allclose(proxy_grm.proxy_grm_reward(acc, proxy, fmt, use_fb=7), [2.0, 1.0, -0.5, -0.5])


@pytest.mark.parametrize("fb", range(11))
def test_all_couplings_match_reference_branches(fb):
    combos = list(itertools.product([1, -1], [1, -1, 0], [0, 1]))
    acc, proxy, fmt = (jnp.array(c) for c in zip(*combos))
    got = proxy_grm.proxy_grm_reward(acc, proxy, fmt, use_fb=fb)
    np.testing.assert_allclose(got, [_py_reward(a, p, f, fb) for a, p, f in combos], rtol=1e-6)


def test_without_proxy_and_bad_fb():
    np.testing.assert_allclose(proxy_grm.proxy_grm_reward(jnp.array([1, -1]), jnp.array([-1, 1]),
                                                          jnp.array([1, 0]), use_proxy=False), [1.5, -1.0])
    with pytest.raises(ValueError, match="use_fb=11"):
        proxy_grm.proxy_grm_reward(1, 1, 1, use_fb=11)


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        fn = self.variant(lambda a, p, f: proxy_grm.proxy_grm_reward(a, p, f, use_fb=3))
        np.testing.assert_allclose(fn(jnp.array([1, 1]), jnp.array([1, 0]), jnp.array([1, 0])), [3.0, 0.5])
