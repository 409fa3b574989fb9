"""`Transformer.forward_groups` (each prompt run once for its G completions) equals the unshared forward.

The reference is `Transformer.forward` over the rows [prompt repeated G times | completion], sliced to the
hidden states that predict the completion tokens (positions W-1 .. W+T-2), i.e. what the train step read
before the shared path. Groups have different left-padding widths (one prompt fills the whole width), rows
have different completion lengths (one has none). Tolerances are fp32's, as test_attention_core.py: values
rtol 1e-5 / atol 1e-6, gradients atol 1e-6 / rtol 1e-5 (scaled to the gradient, see below).
`test_the_check_sees_off_by_one_errors` shows that the comparison fails for a position shifted by one or for
the wrong prompt position feeding completion token 0. Both sides of every comparison are jitted (`_both`, one
program per model and shape; eager dispatch compiled one small program per primitive and shape and cost about
twice as much), except in the off-by-one test, whose monkeypatched paths must be traced afresh.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, lora, shared_prompt
from jaxrl.models.attention import attend, masked_scores
from jaxrl.models.lora_forward import attach
from tests.models._dense_attention import dense_visibility

P, G, W, T = 3, 3, 6, 5
VALUES = dict(rtol=1e-5, atol=1e-6)
GRADS = dict(atol=1e-6, rtol=1e-5)


def grouped_rows(seed=0, p=P, g=G, w=W, t=T, vocab=64):
    """(prompt_PW, pmask_PW, completion_BT, cmask_BT): prompt lengths w, 1, w//2 (cycled), completion lengths
    random in 1..t with row 1 empty and the last row full."""
    rng = np.random.default_rng(seed)
    plen = np.resize(np.array([w, 1, w // 2]), p)
    pmask = np.arange(w)[None, :] >= w - plen[:, None]
    prompt = np.where(pmask, rng.integers(3, vocab, (p, w)), 0).astype(np.int32)
    clen = rng.integers(1, t + 1, p * g)
    clen[1], clen[-1] = 0, t
    cmask = np.arange(t)[None, :] < clen[:, None]
    comp = np.where(cmask, rng.integers(3, vocab, (p * g, t)), 0).astype(np.int32)
    return prompt, pmask, comp, cmask


def unshared_hidden(model, prompt, pmask, comp, cmask):
    g = comp.shape[0] // prompt.shape[0]
    tokens = jnp.concatenate([jnp.repeat(prompt, g, 0), comp], 1)
    mask = jnp.concatenate([jnp.repeat(pmask, g, 0), cmask], 1)
    out = model.forward(tokens, None, mask, return_hidden=True, return_logits=False)
    w = prompt.shape[1]
    return out.hidden[:, w - 1:w + comp.shape[1] - 1]


@nnx.jit
def _both(model, *rows):
    """(`Transformer.forward_groups`, `unshared_hidden`) of `model` on the same rows, in one program."""
    return model.forward_groups(*rows), unshared_hidden(model, *rows)


@functools.cache  # the float32 and float64 tests share it (bit-identical either way, x64 or not)
def _random_model(cfg, seed=0):
    """Every parameter random (norm weights 1 ± 0.1), so that norm placement and biases matter."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    keys = iter(jax.random.split(jax.random.key(seed), 256))

    def noisy(path, a):
        noise = 0.1 * jax.random.normal(next(keys), a.shape, a.dtype)
        return noise + (1.0 if "norm" in jax.tree_util.keystr(path) else a)

    return cfg, jax.tree_util.tree_map_with_path(noisy, params)


CONFIGS = {
    "pre": TransformerConfig.tiny(),
    "post_qwen2_bias_unrolled": TransformerConfig.tiny(norm="post", family="qwen2", qkv_bias=True,
                                                       scan_layers=False),
    "siamese_remat_full": TransformerConfig.tiny(norm="siamese", remat="full"),
    "siamese_hybrid_qk_norm": TransformerConfig.tiny(norm="siamese_hybrid", family="qwen3", qk_norm=True),
    "qwen3_gqa_6q_3kv_remat_dots": TransformerConfig.tiny(family="qwen3", qk_norm=True, num_heads=6,
                                                          num_kv_heads=3, remat="dots", tie_embeddings=True),
    "mqa_kv1_unrolled": TransformerConfig.tiny(num_kv_heads=1, scan_layers=False),
}


def _value_and_grads(cfg, params, rows):
    """(loss, predicting hidden states, parameter gradients) of a weighted sum over the real completion
    positions' hidden states, through `Transformer.forward_groups` and through `unshared_hidden`: both in one
    program (about 30% less compiling than one program each)."""
    cmask = rows[3]
    dtype = params["norm"]["weight"].dtype
    weights = jax.random.normal(jax.random.key(3), (*cmask.shape, cfg.hidden_size)).astype(dtype)

    def value_and_grads(fn, p):
        def scalar(p):
            h = fn(Transformer.from_params(cfg, p), *rows)
            return jnp.sum(jnp.where(cmask[:, :, None], weights * h, 0.0)), h

        (val, h), grads = jax.value_and_grad(scalar, has_aux=True)(p)
        return val, h, grads

    return jax.jit(lambda p: [value_and_grads(fn, p) for fn in (Transformer.forward_groups, unshared_hidden)])(
        params)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hidden_and_gradients_equal_the_unshared_forward(name):
    """fp32, the production code (recomputing `attend`, float32 norms). Gradient atol is 1e-6 of the leaf's
    largest entry: with every weight perturbed, gradients reach |g| ~ 50, and both paths then sit ~2e-5 from
    the float64 gradient (measured; the float64 test below shows that the paths agree to 1e-14)."""
    cfg, params = _random_model(CONFIGS[name], seed=1)
    rows = [jnp.asarray(x) for x in grouped_rows(seed=2)]
    (val, h, grads), (ref_val, ref_h, ref_grads) = _value_and_grads(cfg, params, rows)
    real = np.asarray(rows[3])
    np.testing.assert_allclose(np.asarray(h)[real], np.asarray(ref_h)[real], **VALUES)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)

    def close(path, got, want):
        scale = max(float(np.max(np.abs(want))), 1.0)
        np.testing.assert_allclose(got, want, atol=GRADS["atol"] * scale, rtol=GRADS["rtol"],
                                   err_msg=jax.tree_util.keystr(path))

    jax.tree_util.tree_map_with_path(close, grads, ref_grads)
    assert float(jnp.max(jnp.abs(grads["layers"]["self_attn"]["k_proj"]["kernel"]))) > 1e-3


def _float64(cfg):
    """HACK (test only): `cfg` computing in float64, which TransformerConfig does not offer; with the norms
    and attention patched to follow their input dtype (`_float64_layers`), nothing rounds to float32."""
    cfg = cfg.replace()
    object.__setattr__(cfg, "dtype", "float64")
    object.__setattr__(cfg, "param_dtype", "float64")
    return cfg


def _float64_layers(monkeypatch):
    from jaxrl.models import layers

    def rms(self, x):
        inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * (x * inv)

    def dense(q, k, v, visible, causal=False, block_q=None):
        visible = dense_visibility(visible, q.shape[1])
        scores = jnp.einsum("BLKGH,BKSH->BKGLS", q, k) / np.sqrt(q.shape[-1])
        probs = jax.nn.softmax(jnp.where(visible[:, None, None], scores, -1e300), axis=-1)
        return jnp.einsum("BKGLS,BKSH->BLKGH", probs, v)

    monkeypatch.setattr(layers.RMSNorm, "__call__", rms)
    monkeypatch.setattr(layers, "attend", dense)
    monkeypatch.setattr(shared_prompt, "attend", dense)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_float64_the_paths_are_the_same_function(name, monkeypatch):
    """In float64 (dense attention, float64 norms) the shared and unshared paths agree to ~1e-14 (measured),
    so every fp32 difference above is rounding: rtol 1e-10 here."""
    _float64_layers(monkeypatch)
    with jax.enable_x64(True):
        cfg, params = _random_model(CONFIGS[name], seed=1)
        cfg = _float64(cfg)
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
        rows = [jnp.asarray(x) for x in grouped_rows(seed=2)]
        (val, h, grads), (ref_val, ref_h, ref_grads) = _value_and_grads(cfg, params, rows)
        assert h.dtype == jnp.float64 and grads["norm"]["weight"].dtype == jnp.float64
        real = np.asarray(rows[3])
        np.testing.assert_allclose(np.asarray(h)[real], np.asarray(ref_h)[real], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(val, ref_val, rtol=1e-10)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10), grads, ref_grads)


def test_every_completion_position_matches_padding_included():
    """Beyond the real tokens: the shared forward gives the unshared hidden state at every completion position
    (padding queries see the same keys in both), and at the prompt's last position whatever its padding."""
    cfg, params = _random_model(TransformerConfig.tiny(), seed=4)
    model = Transformer.from_params(cfg, params)
    rows = [jnp.asarray(x) for x in grouped_rows(seed=5)]
    np.testing.assert_allclose(*_both(model, *rows), **VALUES)


def test_unmerged_lora_runs_the_shared_path():
    cfg = TransformerConfig.tiny(norm="post")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    lcfg = lora.LoraConfig(rank=2, alpha=4.0)
    adapters = lora.init_adapters(nnx.state(model, nnx.Param).to_pure_dict(), lcfg, jax.random.key(1))
    adapters = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(jax.random.key(2), x.shape), adapters)
    attached = attach(model, adapters, lcfg)
    rows = [jnp.asarray(x) for x in grouped_rows(seed=6)]
    got, want = _both(attached, *rows)
    np.testing.assert_allclose(got, want, **VALUES)
    assert float(jnp.max(jnp.abs(got - _both(model, *rows)[0]))) > 1e-3  # the adapters act


def test_group_of_one_and_one_group():
    model = Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))
    for p, g in ((4, 1), (1, 5)):
        rows = [jnp.asarray(x) for x in grouped_rows(seed=7, p=p, g=g)]
        np.testing.assert_allclose(*_both(model, *rows), **VALUES)


def test_the_check_sees_off_by_one_errors(monkeypatch):
    """Completion positions shifted by one, or completion token 0 predicted from the prompt's second-to-last
    position, break the comparison far beyond its tolerance."""
    model = Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))
    rows = [jnp.asarray(x) for x in grouped_rows(seed=8)]
    want = np.asarray(unshared_hidden(model, *rows))
    layout, prediction = shared_prompt.layout, shared_prompt.prediction_hidden

    def shifted(*args, **kwargs):
        tokens, positions, visible = layout(*args, **kwargs)
        return tokens, positions.at[:, W:].add(1), visible

    monkeypatch.setattr(shared_prompt, "layout", shifted)
    assert np.abs(np.asarray(model.forward_groups(*rows)) - want).max() > 1e-3
    monkeypatch.setattr(shared_prompt, "layout", layout)

    def second_to_last(hidden_PSD, w, g):
        out_BTD = prediction(hidden_PSD, w, g)
        return out_BTD.at[:, 0].set(jnp.repeat(hidden_PSD[:, w - 2], g, axis=0))

    monkeypatch.setattr(shared_prompt, "prediction_hidden", second_to_last)
    assert np.abs(np.asarray(model.forward_groups(*rows))[:, 0] - want[:, 0]).max() > 1e-3
    monkeypatch.setattr(shared_prompt, "prediction_hidden", prediction)
    np.testing.assert_allclose(model.forward_groups(*rows), want, **VALUES)


def test_causal_attend_with_more_keys_than_queries():
    """`attend(causal=True)` with S > L (query l at key slot S − L + l), the completions' [prompt | own]
    softmax, equals the dense softmax, values and gradients, across block sizes."""
    b, length, s, kv, gq, h = 3, 7, 11, 2, 2, 8
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, length, kv, gq, h)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, kv, s, h)), jnp.float32) for _ in range(2))
    real = rng.random((b, s)) > 0.3
    visible = jnp.asarray(real[:, None, :] & np.tri(length, s, s - length, dtype=bool)[None])
    weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

    def dense(q, k, v):
        probs = jax.nn.softmax(masked_scores(q, k, visible), axis=-1)
        return jnp.einsum("BKGLS,BKSH->BLKGH", probs, v)

    def out_value_and_grads(fn, q, k, v):
        val, grads = jax.value_and_grad(lambda *a: jnp.sum(weights * fn(*a)), argnums=(0, 1, 2))(q, k, v)
        return fn(q, k, v), val, grads

    block_sizes = (1, 3, 7)
    fns = [functools.partial(attend, visible_BLS=visible, causal=True, block_q=n) for n in block_sizes]
    # the dense reference and every block size in one program
    (ref_out, ref_val, ref_grads), *blocked = jax.jit(
        lambda q, k, v: [out_value_and_grads(fn, q, k, v) for fn in (dense, *fns)])(q, k, v)
    for block_q, (out, val, grads) in zip(block_sizes, blocked, strict=True):
        np.testing.assert_allclose(out, ref_out, **VALUES, err_msg=f"block_q {block_q}")
        np.testing.assert_allclose(val, ref_val, rtol=1e-5, err_msg=f"block_q {block_q}")
        for name, got, want in zip("qkv", grads, ref_grads, strict=True):
            np.testing.assert_allclose(got, want, **GRADS, err_msg=f"block_q {block_q} d{name}")
    with pytest.raises(ValueError, match="at least as many keys"):
        attend(q, k[:, :, :5], v[:, :, :5], visible[:, :, :5], causal=True)
