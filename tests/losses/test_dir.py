"""DIR: Bradley-Terry, CLUB MI bound and its classifier, InfoNCE lower bound (spec section 5)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from jaxrl.losses import dir as dir_lib


def _np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _np_club(logits, a):
    logq = _np_log_softmax(logits)
    n = len(a)
    pos = np.mean([logq[i, a[i]] for i in range(n)])
    allp = np.mean([[logq[i, a[j]] for j in range(n)] for i in range(n)])
    return pos - allp


def _np_bt(rc, rr):
    d = np.asarray(rc, np.float64) - np.asarray(rr, np.float64)
    return float(np.mean(-np.log(1.0 / (1.0 + np.exp(-d)))))


def _example_logits():
    q = np.array([0.9, 0.8, 0.3, 0.2])
    return jnp.asarray(np.stack([np.zeros(4), np.log(q / (1 - q))], -1), jnp.float32), jnp.array([1, 1, 0, 0])


def test_spec_example():
    logits, a = _example_logits()
    np.testing.assert_allclose(dir_lib.club_mi(logits, a), 0.72714, atol=1e-5)
    np.testing.assert_allclose(dir_lib.club_classifier_nll(logits, a), 0.22708, atol=1e-5)
    rc, rr = jnp.array([1.0, 0.2]), jnp.array([0.5, 0.4])
    np.testing.assert_allclose(dir_lib.bradley_terry_loss(rc, rr), 0.63611, atol=1e-5)
    loss, metrics = dir_lib.dir_loss(rc, rr, logits, a, gamma=0.1)
    np.testing.assert_allclose(loss, 0.70882, atol=1e-5)
    np.testing.assert_allclose(dir_lib.dir_loss(rc, rr, logits, a, gamma=1.0)[0], 1.36325, atol=1e-5)
    np.testing.assert_allclose(metrics["dir/rm_acc"], 0.5)
    np.testing.assert_allclose(metrics["dir/club_mi"], 0.72714, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("c", [2, 3])
def test_club_nll_bt_match_float64_reference(seed, c):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(9, c))
    a = rng.integers(0, c, size=9)
    np.testing.assert_allclose(dir_lib.club_mi(jnp.asarray(logits, jnp.float32), jnp.asarray(a)),
                               _np_club(logits, a), atol=2e-6)
    np.testing.assert_allclose(dir_lib.club_classifier_nll(jnp.asarray(logits, jnp.float32), jnp.asarray(a)),
                               -np.mean(_np_log_softmax(logits)[np.arange(9), a]), rtol=1e-6)
    rc, rr = rng.normal(scale=5, size=7), rng.normal(scale=5, size=7)
    np.testing.assert_allclose(dir_lib.bradley_terry_loss(jnp.asarray(rc), jnp.asarray(rr)), _np_bt(rc, rr),
                               rtol=1e-6)


def test_bt_extreme_margin_is_finite():
    loss = dir_lib.bradley_terry_loss(jnp.array([-200.0, 200.0]), jnp.array([200.0, -200.0]))
    np.testing.assert_allclose(loss, 200.0, rtol=1e-6)


def test_all_equal_attribute_gives_exactly_zero_and_no_gradient():
    x = jax.random.normal(jax.random.key(0), (6, 4))
    params = dir_lib.init_club_classifier(jax.random.key(1), 4, hidden=8)
    for value in (0, 1):
        a = jnp.full((6,), value)
        f = lambda x: dir_lib.club_mi(dir_lib.apply_club_classifier(params, x), a)
        assert float(f(x)) == 0.0
        np.testing.assert_array_equal(jax.grad(f)(x), 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_infonce_bound_matches_reference_and_is_below_log_n(seed):
    rng = np.random.default_rng(seed)
    s = rng.normal(scale=4.0, size=(5, 5))
    lse = np.log(np.exp(s).sum(1))
    ref = np.log(5) + np.mean(np.diag(s) - lse)
    got = dir_lib.infonce_mi_lower_bound(jnp.asarray(s, jnp.float32))
    np.testing.assert_allclose(got, ref, atol=2e-6)
    assert float(got) <= np.log(5) + 1e-6
    perfect = dir_lib.infonce_mi_lower_bound(jnp.eye(5) * 100.0)
    np.testing.assert_allclose(perfect, np.log(5), atol=1e-5)


def test_gradients_wrt_representations_are_finite_and_checked():
    params = dir_lib.init_club_classifier(jax.random.key(0), 3, hidden=5)
    a = jnp.array([1, 0, 1, 1])
    x = jax.random.normal(jax.random.key(1), (4, 3))
    f = jax.jit(lambda x: dir_lib.club_mi(dir_lib.apply_club_classifier(params, x), a))
    g = jax.grad(f)(x)
    assert bool(jnp.isfinite(g).all()) and float(jnp.abs(g).max()) > 0
    jax.test_util.check_grads(f, (x,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)
    bt = jax.jit(lambda r: dir_lib.bradley_terry_loss(r[:2], r[2:]))
    jax.test_util.check_grads(bt, (jnp.array([0.3, -1.0, 0.5, 2.0]),), order=1, modes=["rev"], atol=1e-2,
                              rtol=1e-2)


def test_classifier_inner_steps_reduce_nll_and_match_python_loop():
    x = jax.random.normal(jax.random.key(0), (16, 4))
    a = (x[:, 0] > 0).astype(jnp.int32)
    params = dir_lib.init_club_classifier(jax.random.key(1), 4, hidden=32)
    opt = optax.adamw(1e-2)
    state = opt.init(params)
    step = jax.jit(dir_lib.classifier_inner_steps, static_argnums=(4, 5))
    new_params, new_state, nll0 = step(params, state, x, a, opt, 5)
    nll_after = dir_lib.club_classifier_nll(dir_lib.apply_club_classifier(new_params, x), a)
    np.testing.assert_allclose(nll0, dir_lib.club_classifier_nll(dir_lib.apply_club_classifier(params, x), a))
    assert float(nll_after) < float(nll0)
    p, s = params, state

    @jax.jit
    def python_step(p, s):
        grads = jax.grad(lambda p: dir_lib.club_classifier_nll(dir_lib.apply_club_classifier(p, x), a))(p)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    for _ in range(5):
        p, s = python_step(p, s)
    for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(p)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # x is detached: the inner steps give no gradient to the representation
    first_leaf = lambda x: jax.tree.leaves(dir_lib.classifier_inner_steps(params, state, x, a, opt, 2)[0])[0]
    gx = jax.jit(jax.grad(lambda x: first_leaf(x).sum()))(x)
    np.testing.assert_array_equal(gx, 0.0)


def test_helpers_and_errors():
    attr = dir_lib.length_attribute(jnp.array([5, 3, 4]), jnp.array([4, 3, 9]))
    np.testing.assert_array_equal(attr, [1, 0, 0])
    hc, hr = jnp.ones((2, 3)), jnp.zeros((2, 3))
    assert dir_lib.pair_representation(hc, hr).shape == (2, 3)
    assert dir_lib.pair_representation(hc, hr, "concat").shape == (2, 6)
    with pytest.raises(ValueError, match="'difference', 'concat'"):
        dir_lib.pair_representation(hc, hr, "sum")
    linear = dir_lib.init_club_classifier(jax.random.key(0), 3, hidden=None)
    assert dir_lib.apply_club_classifier(linear, hc).shape == (2, 2)
    with pytest.raises(ValueError, match="num_classes=1"):
        dir_lib.init_club_classifier(jax.random.key(0), 3, num_classes=1)


def test_default_gamma_is_the_reference_scripts_effective_weight():
    """γ = debias_factor / W: the reference script's debias_factor=1 on 8 GPUs is 0.125 (issue 15 item 5)."""
    assert dir_lib.reference_gamma(1.0, 8) == dir_lib.REFERENCE_GAMMA == 0.125
    assert dir_lib.reference_gamma(0.1, 8) == pytest.approx(0.0125)
    logits, a = _example_logits()
    rc, rr = jnp.array([1.0, 0.2]), jnp.array([0.5, 0.4])
    loss, _ = dir_lib.dir_loss(rc, rr, logits, a)
    np.testing.assert_allclose(loss, 0.63611 + 0.125 * 0.72714, atol=1e-5)
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        dir_lib.reference_gamma(1.0, 0)


def test_classifier_micro_steps_match_sequential_loop_and_club_mi_micro():
    x = jax.random.normal(jax.random.key(2), (12, 4))
    a = (x[:, 1] > 0).astype(jnp.int32)
    params = dir_lib.init_club_classifier(jax.random.key(3), 4, hidden=8)
    opt = optax.adamw(1e-2, weight_decay=0.01)
    state = opt.init(params)
    inner = jax.jit(dir_lib.classifier_inner_steps, static_argnums=(4, 5))
    micro = jax.jit(dir_lib.classifier_micro_steps, static_argnums=(4, 5, 6))
    mi_micro = jax.jit(dir_lib.club_mi_micro)
    club = jax.jit(lambda p, x, a: dir_lib.club_mi(dir_lib.apply_club_classifier(p, x), a))
    stacked, final, _, nll_M = micro(params, state, x, a, opt, 3, 3)
    p, s, ps, nlls = params, state, [], []
    for m in range(3):  # reference order: micro-batch m trains psi, then its CLUB uses that psi
        p, s, nll = inner(p, s, x[4 * m:4 * m + 4], a[4 * m:4 * m + 4], opt, 3)
        ps.append(p)
        nlls.append(nll)
    for got, want in zip(jax.tree.leaves(final), jax.tree.leaves(p)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(nll_M, nlls, rtol=1e-6)
    mi = mi_micro(stacked, x, a)
    rows = [slice(4 * m, 4 * m + 4) for m in range(3)]
    want_mi = np.mean([club(ps[m], x[r], a[r]) for m, r in enumerate(rows)])
    np.testing.assert_allclose(mi, want_mi, rtol=1e-6)
    # one micro-batch is exactly the plain schedule
    one, fin1, _, _ = micro(params, state, x, a, opt, 3, 1)
    plain, _, _ = inner(params, state, x, a, opt, 3)
    for got, want in zip(jax.tree.leaves(fin1), jax.tree.leaves(plain)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(mi_micro(one, x, a), club(plain, x, a), rtol=1e-6)
    # gradients reach x through the CLUB term only; psi is held fixed
    g_x, g_p = jax.jit(jax.grad(lambda xx, st: dir_lib.club_mi_micro(st, xx, a), argnums=(0, 1)))(x, stacked)
    assert float(jnp.abs(g_x).max()) > 0 and all(float(jnp.abs(v).max()) == 0 for v in jax.tree.leaves(g_p))
    with pytest.raises(ValueError, match="do not split into micro_batches=5"):
        dir_lib.classifier_micro_steps(params, state, x, a, opt, 3, 5)


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_reference(self):
        logits, a = _example_logits()
        rc, rr = jnp.array([1.0, 0.2]), jnp.array([0.5, 0.4])
        loss, metrics = self.variant(lambda *args: dir_lib.dir_loss(*args, gamma=1.0))(rc, rr, logits, a)
        np.testing.assert_allclose(loss, 1.36325, atol=1e-5)
        np.testing.assert_allclose(metrics["dir/bt"], 0.63611, atol=1e-5)
