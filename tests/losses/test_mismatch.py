"""Tests for jaxrl.losses.mismatch: spec algorithms-2 §4 worked example, float64 reference, jit, no gradient
through the weights, and agreement with TRL 1.16's `vllm_importance_sampling_*` code path."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl.losses import mismatch_metrics, rollout_correction

# Spec §4 example (row 0); row 1 is a shorter response padded with garbage.
TRAIN = np.array([[-0.20, -1.10, -0.30, -2.00], [-0.50, -0.70, 9.0, np.nan]])
SAMPLER = np.array([[-0.25, -1.08, -1.60, -1.10], [-0.40, -0.90, np.nan, -3.0]])
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
RHO0 = [1.05127, 0.98020, 3.66930, 0.40657]


def _run(**kw):
    return rollout_correction(jnp.asarray(TRAIN, jnp.float32), jnp.asarray(SAMPLER, jnp.float32),
                              jnp.asarray(MASK), **kw)


@pytest.mark.parametrize("kw,row0", [
    (dict(mode="truncate", upper=3.0), [1.05127, 0.98020, 3.0, 0.40657]),           # TRL token_truncate
    (dict(mode="mask", upper=3.0), [1.05127, 0.98020, 0.0, 0.40657]),               # TRL token_mask
    (dict(mode="truncate", upper=2.0), [1.05127, 0.98020, 2.0, 0.40657]),           # verl token TIS
    (dict(mode="mask", lower=0.5, upper=5.0), [1.05127, 0.98020, 3.66930, 0.0]),    # verl IcePop 0.5_5.0
    (dict(level="sequence", mode="mask", upper=3.0), [1.53726] * 4),                 # TRL sequence_mask
    (dict(level="sequence", mode="truncate", upper=3.0), [1.53726] * 4),
    (dict(level="sequence", mode="truncate", upper=1.5), [1.5] * 4),
    (dict(level="sequence", mode="mask", upper=1.5), [0.0] * 4),
    (dict(level="geometric", mode="truncate", upper=2.0), [1.11349] * 4),
])
def test_spec_worked_example(kw, row0):
    w, keep, m = _run(**kw)
    np.testing.assert_allclose(w[0], row0, atol=1e-5)
    # Row 1: delta = [-0.1, 0.2], inside every band used here; its padding (garbage) gets weight 0.
    row1 = {"token": [np.exp(-0.1), np.exp(0.2)], "sequence": [np.exp(0.1)] * 2,
            "geometric": [np.exp(0.05)] * 2}[kw.get("level", "token")]
    np.testing.assert_allclose(w[1], row1 + [0.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(keep, MASK & (np.asarray(w) > 0))
    if kw["mode"] == "mask":
        np.testing.assert_allclose(m["mismatch/rejected_frac"], np.mean(np.asarray(w)[MASK] == 0), rtol=1e-6)


def test_spec_metrics():
    m = mismatch_metrics(jnp.asarray(TRAIN[:1]), jnp.asarray(SAMPLER[:1]), jnp.asarray(MASK[:1]), cap=2.0)
    np.testing.assert_allclose(m["mismatch/abs_logp_diff_mean"], 0.5675, rtol=1e-5)   # TRL logp difference
    np.testing.assert_allclose(m["mismatch/abs_logp_diff_max"], 1.3, rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/kl"], -0.1075, rtol=1e-4)                  # verl kl
    np.testing.assert_allclose(m["mismatch/k3_kl"], 0.41933, rtol=1e-4)               # verl k3_kl
    np.testing.assert_allclose(m["mismatch/frac_above_cap"], 0.25)                    # verl fraction_high
    np.testing.assert_allclose(m["mismatch/frac_below_inv_cap"], 0.25)                # verl fraction_low
    np.testing.assert_allclose(m["mismatch/ratio_max"], 3.66930, rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/ratio_min"], 0.40657, rtol=1e-4)
    w, _, mw = rollout_correction(jnp.asarray(TRAIN[:1]), jnp.asarray(SAMPLER[:1]), jnp.asarray(MASK[:1]))
    np.testing.assert_allclose(mw["mismatch/is_weight_mean"], 1.10951, rtol=1e-5)     # verl rollout_is_mean
    np.testing.assert_allclose(mw["mismatch/truncated_frac"], 0.25)


def _np_correction(train, sampler, mask, level, mode, lower, upper, normalize):
    d = np.where(mask & ~np.isnan(train - sampler), train - sampler, 0.0)
    if level == "token":
        lr = d
    else:
        lr = d.sum(1, keepdims=True)
        if level == "geometric":
            lr = lr / np.maximum(mask.sum(1, keepdims=True), 1)
        lr = np.repeat(lr, d.shape[1], 1)
    rho = np.exp(np.clip(lr, -20, 20))
    lo, hi = (-np.inf if lower is None else lower), (np.inf if upper is None else upper)
    w = np.clip(rho, lo, hi) if mode == "truncate" else np.where((rho >= lo) & (rho <= hi), rho, 0.0)
    w = np.where(mask, w, 0.0)
    if normalize:
        mean = w[mask].mean() if level == "token" else w[mask.any(1), 0].mean()
        w = w / mean if mean > 1e-8 else w
    return w


def _random(seed, b=7, t=6, scale=0.7):
    rng = np.random.default_rng(seed)
    train = rng.normal(-1.5, 1.0, size=(b, t))
    sampler = train + rng.normal(0.0, scale, size=(b, t))
    lens = rng.integers(1, t + 1, size=b)
    mask = np.arange(t)[None] < lens[:, None]
    sampler[0, 0] = np.nan  # a token the engine could not score
    return train, np.where(mask, sampler, np.inf), mask


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("bounds,normalize", [((None, 2.0), False), ((0.5, 2.0), True), ((0.8, None), False)])
def test_matches_float64_reference(level, mode, bounds, normalize):
    train, sampler, mask = _random(1)
    mask[3] = False  # an empty row
    w, keep, _ = rollout_correction(jnp.asarray(train, jnp.float32), jnp.asarray(sampler, jnp.float32),
                                    jnp.asarray(mask), level=level, mode=mode, lower=bounds[0],
                                    upper=bounds[1],
                                    batch_normalize=normalize)
    ref = _np_correction(train, sampler, mask, level, mode, *bounds, normalize)
    np.testing.assert_allclose(w, ref, rtol=2e-5, atol=1e-6)
    assert np.all(np.asarray(w)[~mask] == 0.0)
    if mode == "truncate":
        np.testing.assert_array_equal(keep, mask)


def test_weights_carry_no_gradient_and_fully_masked_batch_is_finite():
    train, sampler, mask = (jnp.asarray(x, jnp.float32) for x in _random(2))
    mask = mask.astype(bool)
    for level in ("token", "sequence"):
        g = jax.grad(lambda t: jnp.sum(rollout_correction(t, sampler, mask, level=level)[0] * t))(train)
        w = rollout_correction(train, sampler, mask, level=level)[0]
        np.testing.assert_allclose(g, w)  # d(sg[w] t)/dt = w: no gradient through the weights
    w, keep, m = rollout_correction(train, sampler, jnp.zeros_like(mask), mode="mask", batch_normalize=True)
    assert np.all(np.asarray(w) == 0.0) and not np.any(keep)
    assert all(np.isfinite(v) for v in m.values())


def test_bad_options_raise():
    x = jnp.zeros((1, 2))
    for kw, msg in [(dict(level="seq"), "level='seq'"), (dict(mode="clip"), "mode='clip'"),
                    (dict(lower=None, upper=None), "at least one"),
                    (dict(lower=3.0, upper=2.0), "lower <= upper")]:
        with pytest.raises(ValueError, match=msg):
            rollout_correction(x, x, x, **kw)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min,clip_max", [(None, 3.0), (0.5, 2.0)])
def test_agrees_with_trl_vllm_importance_sampling(mode, clip_min, clip_max):
    oracle = pytest.importorskip("_trl_oracle")
    train, sampler, mask = _random(3, scale=0.6)
    sampler = np.where(mask, sampler, 0.0)
    trl_w, trl_m = oracle.trl_vllm_importance_weights(train, sampler, mask, mode=mode, clip_min=clip_min,
                                                      clip_max=clip_max)
    level, kind = mode.split("_")
    with jax.enable_x64(True):
        w, _, m = rollout_correction(jnp.asarray(train), jnp.asarray(sampler), jnp.asarray(mask), level=level,
                                     mode=kind, lower=clip_min, upper=clip_max)
    np.testing.assert_allclose(w, np.where(mask, trl_w, 0.0), rtol=1e-12)  # TRL's [B, 1] broadcasts over T
    raw = np.exp(np.nan_to_num(np.where(mask, train - sampler, 0.0)))
    raw = raw if level == "token" else np.repeat(np.prod(raw, 1, keepdims=True), raw.shape[1], 1)
    out = (raw > clip_max) | (raw < (clip_min or 0.0))
    assert np.any(out[mask]) and not np.all(out[mask])  # the case exercises both sides of the bounds
    for ours, theirs in [("abs_logp_diff_mean", "sampling/sampling_logp_difference/mean"),
                         ("abs_logp_diff_max", "sampling/sampling_logp_difference/max"),
                         ("is_weight_mean", "sampling/importance_sampling_ratio/mean"),
                         ("is_weight_min", "sampling/importance_sampling_ratio/min"),
                         ("is_weight_max", "sampling/importance_sampling_ratio/max")]:
        np.testing.assert_allclose(m["mismatch/" + ours], trl_m[theirs][0], rtol=1e-6, err_msg=ours)


def _policy_case(seed):
    """Trainer/sampler log-probs with rejected tokens on both sides, a current policy near the trainer's, and
    advantages per row (float64)."""
    train, sampler, mask = _random(seed, scale=0.6)
    sampler = np.where(mask, np.nan_to_num(sampler, nan=-1.5), 0.0)
    rng = np.random.default_rng(seed + 10)
    logp = train + rng.normal(0.0, 0.15, size=train.shape)
    adv = rng.normal(size=(train.shape[0], 1)) * np.ones_like(train)
    return train, sampler, mask, logp, adv


def _np_ppo(logp, old, adv, eps=0.2):
    r = np.exp(logp - old)
    return -np.minimum(r * adv, np.clip(r, 1 - eps, 1 + eps) * adv)


def _np_agg(v, m, mode):
    v = np.where(m, v, 0.0)
    if mode == "token-mean":
        return v.sum() / max(m.sum(), 1)
    rows = m.any(1)
    return (v.sum(1)[rows] / m.sum(1)[rows]).sum() / max(rows.sum(), 1)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_reject_modes_share_weights_and_differ_in_the_mask(level):
    train, sampler, mask = (jnp.asarray(x) for x in _random(5, scale=0.6))
    kw = dict(level=level, mode="mask", lower=0.5, upper=2.0)
    w_m, keep_m, met_m = rollout_correction(train, sampler, mask, **kw)
    w_z, keep_z, met_z = rollout_correction(train, sampler, mask, reject="zero_weight", **kw)
    np.testing.assert_array_equal(w_m, w_z)
    np.testing.assert_array_equal(keep_z, mask)  # TRL: rejected tokens stay, with weight 0
    inside = np.asarray(w_m) > 0
    np.testing.assert_array_equal(keep_m, np.asarray(mask) & inside)  # verl: they leave the mask
    assert np.any(np.asarray(mask) & ~inside)
    assert met_m["mismatch/rejected_frac"] == met_z["mismatch/rejected_frac"] > 0
    w_t, keep_t, _ = rollout_correction(train, sampler, mask, level=level, mode="truncate", upper=2.0,
                                        reject="zero_weight")
    np.testing.assert_array_equal(keep_t, mask)  # TIS rejects nothing
    with pytest.raises(ValueError, match="reject"):
        rollout_correction(train, sampler, mask, reject="drop")


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_mis_reject_mask_is_verls_rejection_sampling(level, agg):
    """verl (`rollout_corr_helper`: rejection sampling multiplies the response mask by the in-band indicator,
    IS weights on the kept tokens): loss = agg(l_pg · ρ, m · 1[C_min <= ρ <= C_max]); the KL term is
    aggregated over the same reduced mask."""
    from jaxrl.losses import aggregate, clipped_objective, kl_penalty

    train, sampler, mask, logp, adv = _policy_case(6)
    ref_logp = train - 0.3
    with jax.enable_x64(True):
        w, keep, _ = rollout_correction(jnp.asarray(train), jnp.asarray(sampler), jnp.asarray(mask),
                                        level=level, mode="mask", lower=0.5, upper=2.0)
        pg, _ = clipped_objective(jnp.asarray(logp), jnp.asarray(train), jnp.asarray(adv), keep)
        kl = kl_penalty(jnp.asarray(logp), jnp.asarray(ref_logp), "k1")
        loss = float(aggregate(pg * w + 0.1 * kl, keep, agg))
    d = np.where(mask, train - sampler, 0.0)
    rho = np.exp(d if level == "token" else np.repeat(d.sum(1, keepdims=True), d.shape[1], 1))
    kept = mask & (rho >= 0.5) & (rho <= 2.0)
    assert kept.sum() < mask.sum()
    expected = _np_agg(_np_ppo(logp, train, adv) * rho + 0.1 * (logp - ref_logp), kept, agg)
    np.testing.assert_allclose(loss, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", ["token_mask", "sequence_mask"])
@pytest.mark.parametrize("loss_type,agg", [("dapo", "token-mean"), ("grpo", "seq-mean-token-mean")])
def test_mis_reject_zero_weight_is_trls_loss(mode, loss_type, agg):
    """TRL 1.16 (`vllm_importance_sampling_mode=token_mask / sequence_mask`): the IS weight (0 when rejected)
    multiplies the per-token loss, aggregated over the unchanged completion mask. Checked by running TRL's
    own `_compute_loss` on its own weights."""
    oracle = pytest.importorskip("_trl_oracle")
    from jaxrl.losses import aggregate, clipped_objective

    train, sampler, mask, logp, adv = _policy_case(7)
    trl_w, _ = oracle.trl_vllm_importance_weights(train, sampler, mask, mode=mode, clip_min=0.5, clip_max=2.0)
    trl_loss, _, _ = oracle.trl_compute_loss(logp, train, adv[:, 0], mask, loss_type=loss_type,
                                             is_ratio=trl_w)
    level = mode.split("_")[0]
    with jax.enable_x64(True):
        w, keep, _ = rollout_correction(jnp.asarray(train), jnp.asarray(sampler), jnp.asarray(mask),
                                        level=level, mode="mask", lower=0.5, upper=2.0, reject="zero_weight")
        pg, _ = clipped_objective(jnp.asarray(logp), jnp.asarray(train), jnp.asarray(adv), keep)
        loss = float(aggregate(pg * w, keep, agg))
        w_m, keep_m, _ = rollout_correction(jnp.asarray(train), jnp.asarray(sampler), jnp.asarray(mask),
                                            level=level, mode="mask", lower=0.5, upper=2.0)
        verl_loss = float(aggregate(pg * w_m, keep_m, agg))
    assert np.any(np.asarray(mask) & (np.where(mask, trl_w, 1.0) == 0.0))  # something was rejected
    np.testing.assert_allclose(loss, trl_loss, rtol=1e-10)
    assert abs(verl_loss - trl_loss) > 1e-4  # the two rules differ on this case


class JitTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_equals_eager(self):
        train, sampler, mask = (jnp.asarray(x, jnp.float32) for x in _random(4))
        for level in ("token", "sequence"):
            fn = lambda a, b, c: rollout_correction(a, b, c, level=level, mode="mask", lower=0.5, upper=2.0)
            args = (train, sampler, mask)
            chex.assert_trees_all_close(self.variant(fn)(*args), fn(*args), rtol=1e-6)
