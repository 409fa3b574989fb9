"""CLIPO contrastive head loss and reward bonus (spec section 4)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from jaxrl.losses import clipo

EPS = 1e-8


def _np_grpo(r, g, eps=1e-6):
    r = np.asarray(r, np.float64).reshape(-1, g)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + eps)).reshape(-1)


def _np_sets(y, g, level):
    """Positive and 'all' index sets per anchor, written as explicit loops."""
    b = len(y)
    pos, others, neg_count = [], [], []
    for i in range(b):
        gi = i // g
        in_group = [j for j in range(b) if j // g == gi]
        cand_all = list(range(b)) if level in ("batch", "cross") else in_group
        cand_pos = [j for j in (range(b) if level == "batch" else in_group) if y[j] == y[i]]
        pos.append([j for j in cand_pos if j != i])
        others.append([j for j in cand_all if j != i])
        neg_count.append(len([j for j in cand_all if j not in cand_pos]))
    return pos, others, neg_count


def _np_losses(z, y, g, tau, kind, level, masked_label=0, skip_trivial=True, picks=None):
    z = np.asarray(z, np.float64)
    s = z @ z.T / tau
    pos, others, neg_count = _np_sets(y, g, level)
    out = np.zeros(len(y))
    anchor = np.zeros(len(y), bool)
    for i in range(len(y)):
        keep = masked_label == -1 or y[i] != masked_label
        if skip_trivial:
            keep = keep and len(pos[i]) > 0 and neg_count[i] > 0
        anchor[i] = keep
        if not keep:
            continue
        l = s[i] - s[i].max()
        lse = np.log(np.sum(np.exp(l[others[i]])) + EPS)
        lpos = np.log(np.sum(np.exp(l[pos[i]])) + EPS)
        if kind == "infonce":
            out[i] = -(l[picks[i]] - lse)
        elif kind == "supcon_out":
            out[i] = -np.sum(l[pos[i]] - lse) / (len(pos[i]) + EPS)
        elif kind == "supcon_in":
            out[i] = -(lpos - lse - np.log(len(pos[i]) + EPS))
        else:
            out[i] = -(lpos - lse)
    head = out.sum() / (anchor.sum() + EPS)
    return head, out, anchor


def _example():
    z = jnp.array([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]])
    y = jnp.array([1, 1, 0, 0])
    return z, y


def test_spec_example_losses_bonus_and_grpo():
    z, y = _example()
    head, per, anchor = clipo.contrastive_loss(z, y, 4, key=jax.random.key(0))
    np.testing.assert_allclose(per, [0.0182, 3.2407, 0.0, 0.0], atol=5e-5)
    np.testing.assert_array_equal(anchor, [True, True, False, False])
    np.testing.assert_allclose(head, 1.6294, atol=5e-5)
    # exact closed forms from the spec; float32 logits of size ~20 carry ~2e-6 absolute rounding
    np.testing.assert_allclose(per[0], np.log(1 + np.exp(-4) + np.exp(-16)), rtol=0, atol=4e-6)
    np.testing.assert_allclose(per[1], np.log(1 + np.exp(3.2) + np.exp(-4)), rtol=0, atol=4e-6)
    bonus = clipo.contrastive_bonus(per, y, anchor)
    np.testing.assert_allclose(bonus, [-0.0036, -0.5, 0.0, 0.0], atol=5e-5)
    total = np.array([1.0, 1.0, 0.0, 0.0]) + np.asarray(bonus, np.float64)
    np.testing.assert_allclose(total, [0.9964, 0.5, 0.0, 0.0], atol=5e-5)
    np.testing.assert_allclose(_np_grpo(total, 4), [1.3042, 0.2639, -0.7840, -0.7840], atol=5e-4)


def test_spec_example_grpo_with_part_a_if_present():
    adv_mod = pytest.importorskip("jaxrl.losses.advantages")
    if not hasattr(adv_mod, "group_advantages"):
        pytest.skip("group_advantages not there yet")
    z, y = _example()
    _, per, anchor = clipo.contrastive_loss(z, y, 4, key=jax.random.key(0))
    total = y.astype(jnp.float32) + clipo.contrastive_bonus(per, y, anchor)
    adv = adv_mod.group_advantages(total, 4)
    np.testing.assert_allclose(adv, [1.3042, 0.2639, -0.7840, -0.7840], atol=5e-4)


def _random_case(seed, b=12, g=4, d=5):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(b, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    y = rng.integers(0, 2, size=b)
    y[:4] = [1, 1, 0, 1]  # first group: certainly non-trivial anchors
    return z.astype(np.float32), y


@pytest.mark.parametrize("kind", ["supcon_out", "supcon_in", "soft_nn"])
@pytest.mark.parametrize("level", ["group", "batch", "cross"])
@pytest.mark.parametrize("masked_label", [0, -1])
def test_deterministic_kinds_match_float64_reference(kind, level, masked_label):
    z, y = _random_case(1)
    head, per, anchor = clipo.contrastive_loss(
        jnp.asarray(z), jnp.asarray(y), 4, kind=kind, level=level, tau=0.3, masked_label=masked_label)
    ref_head, ref_per, ref_anchor = _np_losses(z, y, 4, 0.3, kind, level, masked_label)
    np.testing.assert_array_equal(anchor, ref_anchor)
    np.testing.assert_allclose(per, ref_per, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(head, ref_head, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("level", ["group", "batch", "cross"])
def test_infonce_picks_a_positive_and_matches_reference(level):
    z, y = _random_case(2)
    key = jax.random.key(7)
    _, per, anchor = clipo.contrastive_loss(jnp.asarray(z), jnp.asarray(y), 4, tau=0.3, key=key, level=level)
    pos, _, _ = _np_sets(y, 4, level)
    for i in np.flatnonzero(np.asarray(anchor)):
        others = {k: 0 for k in range(12) if k != i}
        cands = [_np_losses(z, y, 4, 0.3, "infonce", level, picks={i: p} | others)
                 [1][i] for p in pos[i]]
        assert np.min(np.abs(np.array(cands) - float(per[i]))) < 2e-5, (i, cands, per[i])
    _, per_again, _ = clipo.contrastive_loss(jnp.asarray(z), jnp.asarray(y), 4, tau=0.3, key=key, level=level)
    np.testing.assert_array_equal(per, per_again)


def test_infonce_mean_over_keys_approaches_supcon_out():
    z, y = _random_case(3)
    keys = jax.random.split(jax.random.key(0), 400)
    per_k = jax.jit(jax.vmap(
        lambda k: clipo.contrastive_loss(jnp.asarray(z), jnp.asarray(y), 4, tau=0.5, key=k)[1]))(keys)
    _, per_out, _ = clipo.contrastive_loss(jnp.asarray(z), jnp.asarray(y), 4, tau=0.5, kind="supcon_out")
    np.testing.assert_allclose(per_k.mean(0), per_out, atol=0.05)
    assert float(per_k.std(0).max()) > 0.0  # some anchor has several positives


def test_edge_cases_no_valid_anchor():
    z = jnp.eye(4)
    for y in ([1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]):
        head, per, anchor = clipo.contrastive_loss(z, jnp.array(y), 4, key=jax.random.key(0))
        assert float(head) == 0.0 and not bool(anchor.any())
        np.testing.assert_array_equal(per, 0.0)
        np.testing.assert_array_equal(clipo.contrastive_bonus(per, jnp.array(y), anchor), 0.0)


def test_bonus_clamp_and_c0():
    per = jnp.array([10.0, 1.0, 1.0, 0.0])
    bonus = clipo.contrastive_bonus(per, jnp.array([1, 1, 0, 0]), jnp.array([True, True, False, False]),
                                    lam=0.2, c0=0.1, floor=-0.5)
    np.testing.assert_allclose(bonus, [-0.5, -0.1, 0.1, 0.1], atol=1e-7)


def test_mean_pool_masks_padding_and_empty_rows():
    h = jnp.arange(2 * 3 * 2, dtype=jnp.float32).reshape(2, 3, 2)
    m = jnp.array([[1, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(clipo.mean_pool(h, m), [[1.0, 2.0], [0.0, 0.0]])


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_head_grad_zero_without_anchor_and_finite_with(kind):
    cfg = clipo.ContrastiveHeadConfig(in_dim=6, out_dim=3, kind=kind)
    params = clipo.init_contrastive_head(cfg, jax.random.key(0))
    h = jax.random.normal(jax.random.key(1), (8, 6))
    loss_fn = lambda p, y: clipo.clipo_head_loss(p, h, y, 4, key=jax.random.key(2))[0]
    grad_fn = jax.jit(jax.grad(loss_fn))
    g_none = grad_fn(params, jnp.array([1, 0, 0, 0, 0, 0, 0, 0]))
    for leaf in jax.tree.leaves(g_none):
        np.testing.assert_array_equal(leaf, 0.0)
    g_some = grad_fn(params, jnp.array([1, 1, 0, 0, 1, 0, 1, 1]))
    assert all(bool(jnp.isfinite(leaf).all()) for leaf in jax.tree.leaves(g_some))
    assert any(float(jnp.abs(leaf).max()) > 0 for leaf in jax.tree.leaves(g_some))
    z = clipo.apply_contrastive_head(params, jnp.zeros((2, 6)))
    assert bool(jnp.isfinite(z).all())


def test_head_training_step_lowers_loss():
    cfg = clipo.ContrastiveHeadConfig(in_dim=6, out_dim=4)
    params = clipo.init_contrastive_head(cfg, jax.random.key(0))
    h = jax.random.normal(jax.random.key(1), (8, 6))
    y = jnp.array([1, 1, 0, 0, 1, 1, 1, 0])
    opt = optax.adamw(1e-2, weight_decay=0.01)
    state = opt.init(params)
    loss_fn = jax.jit(lambda p: clipo.clipo_head_loss(p, h, y, 4, kind="supcon_out", tau=0.5)[0])

    @jax.jit
    def step(params, state):
        grads = jax.grad(loss_fn)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    before = loss_fn(params)
    for _ in range(20):
        params, state = step(params, state)
    assert float(loss_fn(params)) < float(before)


def test_bad_arguments_are_named():
    z, y = _example()
    with pytest.raises(ValueError, match="group_size=3"):
        clipo.contrastive_loss(z, y, 3, kind="soft_nn")
    with pytest.raises(ValueError, match="needs key"):
        clipo.contrastive_loss(z, y, 4)
    with pytest.raises(ValueError, match="kind='nope'"):
        clipo.contrastive_loss(z, y, 4, kind="nope")
    with pytest.raises(ValueError, match="level='x'"):
        clipo.contrastive_loss(z, y, 4, kind="soft_nn", level="x")
    with pytest.raises(ValueError, match="'linear', 'mlp'"):
        clipo.ContrastiveHeadConfig(in_dim=3, kind="deep")


class VariantsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        z, y = _random_case(4)
        fn = self.variant(lambda z, y, k: clipo.contrastive_loss(z, y, 4, key=k, level="cross"))
        head, per, anchor = fn(jnp.asarray(z), jnp.asarray(y), jax.random.key(3))
        head2, per2, anchor2 = jax.jit(
            lambda z, y, k: clipo.contrastive_loss(z, y, 4, key=k, level="cross"))(
                jnp.asarray(z), jnp.asarray(y),
                                                                                   jax.random.key(3))
        np.testing.assert_allclose(head, head2, rtol=1e-6)
        np.testing.assert_allclose(per, per2, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(anchor, anchor2)
