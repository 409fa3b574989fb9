"""`model.attention: cudnn | splash` (`jaxrl.models.attention_fused`) compute jaxrl's attention, on CPU.

cuDNN itself runs only on a GPU (benchmarks/device/attention.py compares it with the blocked core there);
Pallas splash attention (TPU) runs here in Pallas' interpret mode, the kernel's own code.
Here `jax.nn.dot_product_attention(implementation="xla")`, JAX's reference of the same call (same
arguments: causal, lengths), stands in for the kernel, so that everything jaxrl adds around it is tested
in float32 against the blocked core (`attention.attend`): the compaction of left-padded, right-padded and
holed rows, queries after their prompt keys (the shared-prompt completions), GQA head order, the
unpermutation, and gradients through all of it, for single calls and whole models. Padding queries: 0 here,
finite garbage in the blocked core; only real positions are compared (nothing reads the others).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, attention_fused
from jaxrl.models.attention import KeyMask, attend
from jaxrl.models.attention_fused import attend_fused, compaction_BS
from tests.models.test_shared_prompt import _random_model, grouped_rows, unshared_hidden

B, S, K, G, H = 5, 13, 2, 3, 8
VALUES = dict(rtol=1e-5, atol=1e-6)


def _key_mask_BS() -> np.ndarray:
    """Full; left-padded by 4; right-padded by 5; a hole at 6 (an environment turn's padding); no real key."""
    mask = np.ones((B, S), bool)
    mask[1, :4] = False
    mask[2, -5:] = False
    mask[3, 6] = False
    mask[4] = False
    return mask


def _inputs(length: int, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, length, K, G, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(B, K, S, H)), jnp.float32) for _ in range(2))
    return q, k, v, jnp.asarray(_key_mask_BS())


def _fused(q, k, v, mask, kernel="cudnn"):
    return attend_fused(q, k, v, mask, causal=True, kernel=kernel, implementation="xla")


@pytest.fixture(autouse=True)
def splash_interpreted(monkeypatch):
    """Pallas splash attention runs in interpret mode on CPU."""
    monkeypatch.setitem(attention_fused.SPLASH_INTERPRET, "interpret", True)


def _blocked(q, k, v, mask):
    return attend(q, k, v, KeyMask(mask), causal=True, block_q=4)


def _out_value_and_grads(fn, q, k, v, mask, weights):
    """(`fn`'s output, the weighted sum of it and its q/k/v gradients), one program per `fn` and shape: the
    plain forward and the one under differentiation are the same operations."""
    val, grads = jax.value_and_grad(lambda *a: jnp.sum(weights * fn(*a, mask)), argnums=(0, 1, 2))(q, k, v)
    return fn(q, k, v, mask), val, grads


_jit_out_value_and_grads = jax.jit(_out_value_and_grads, static_argnums=0)
_FUSED = {kernel: lambda q, k, v, mask, kernel=kernel: _fused(q, k, v, mask, kernel) for kernel in ("cudnn", "splash")}


@pytest.mark.parametrize("kernel", ["cudnn", "splash"])
@pytest.mark.parametrize("length", [S, 5, 1])  # self-attention; completions after 8 / 12 prompt keys
def test_values_and_gradients_equal_the_blocked_core(length, kernel):
    """Outputs at real queries, 0 at padding queries, the weighted sum and finite q/k/v gradients equal the
    blocked core's (computed once per length for both kernels)."""
    q, k, v, mask = _inputs(length)
    real_BL = np.asarray(mask[:, S - length:])
    weights = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32) * real_BL[..., None, None,
                                                                                                 None]
    got_out, got, got_grads = _jit_out_value_and_grads(_FUSED[kernel], q, k, v, mask, weights)
    want_out, want, want_grads = _jit_out_value_and_grads(_blocked, q, k, v, mask, weights)
    np.testing.assert_allclose(np.asarray(got_out)[real_BL], np.asarray(want_out)[real_BL], **VALUES)
    assert not np.any(np.asarray(got_out)[~real_BL]), "padding queries are 0"
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
        assert np.all(np.isfinite(a))
    assert float(jnp.max(jnp.abs(want_grads[1]))) > 1e-3  # key gradients are part of the comparison


def test_the_check_sees_a_missing_compaction(monkeypatch):
    """Without compaction the lengths mask the wrong keys of a left-padded or holed row: the values differ."""
    def identity(mask_BS):
        perm_BS = jnp.broadcast_to(jnp.arange(mask_BS.shape[1]), mask_BS.shape)
        return perm_BS, perm_BS, jnp.maximum(jnp.sum(mask_BS, axis=1, dtype=jnp.int32), 1)

    q, k, v, mask = _inputs(S)
    monkeypatch.setattr(attention_fused, "compaction_BS", identity)
    real_BL = np.asarray(mask)
    fused = jax.jit(lambda *a: _fused(*a))  # a new function: jit's cache holds the unpatched trace of _fused
    diff = np.abs(np.asarray(fused(q, k, v, mask)) - np.asarray(jax.jit(_blocked)(q, k, v, mask)))
    assert diff[real_BL].max() > 1e-2


def test_compaction_puts_real_keys_first_in_order():
    mask = jnp.asarray(_key_mask_BS())
    perm, inverse, count = (np.asarray(x) for x in compaction_BS(mask))
    for row, real in enumerate(np.asarray(mask)):
        n = int(real.sum())
        np.testing.assert_array_equal(perm[row, :n], np.flatnonzero(real))
        np.testing.assert_array_equal(perm[row][inverse[row]], np.arange(S))
        assert count[row] == max(n, 1)


def test_refuses_what_it_cannot_compute():
    q, k, v, mask = _inputs(S)
    with pytest.raises(ValueError, match="causal"):
        attend_fused(q, k, v, mask, causal=False, kernel="cudnn")
    with pytest.raises(ValueError, match="key slot"):
        attend_fused(q, k[:, :, :4], v[:, :, :4], mask[:, :4], causal=True, kernel="cudnn")


@pytest.fixture
def cudnn_as_reference(monkeypatch):
    """`TransformerConfig.attention="cudnn"` runs JAX's XLA reference of the fused call."""
    monkeypatch.setitem(attention_fused.IMPLEMENTATIONS, "cudnn", "xla")


def test_whole_model_unshared_and_shared_prompt(cudnn_as_reference):
    """With each fused kernel, hidden states at real positions and parameter gradients of the unshared forward
    (left-padded prompts, right-padded completions) and of `forward_groups` (completions after their shared
    prompt) equal the blocked core's; Qwen3 layout with grouped queries and dots remat."""
    cfg = TransformerConfig.tiny(family="qwen3", qk_norm=True, num_heads=6, num_kv_heads=3, remat="dots")
    _, params = _random_model(cfg, seed=1)
    rows = [jnp.asarray(x) for x in grouped_rows(seed=2)]
    cmask = rows[3]
    weights = jax.random.normal(jax.random.key(3), (*cmask.shape, cfg.hidden_size))

    def run(kernel, fn, p):
        def scalar(p):
            h = fn(Transformer.from_params(cfg.replace(attention=kernel), p), *rows)
            return jnp.sum(jnp.where(cmask[:, :, None], weights * h, 0.0)), h

        (_, h), grads = jax.value_and_grad(scalar, has_aux=True)(p)
        return h, grads

    kernels = ("xla", "cudnn", "splash")
    for fn in (unshared_hidden, Transformer.forward_groups):
        # the three kernels' models in one program: about 30% less compiling than one program each
        outs = jax.jit(lambda p: [run(kernel, fn, p) for kernel in kernels])(params)  # noqa: B023
        (want_h, want_grads), *fused = outs
        real = np.asarray(cmask)
        for kernel, (h, grads) in zip(kernels[1:], fused, strict=True):
            np.testing.assert_allclose(np.asarray(h)[real], np.asarray(want_h)[real], **VALUES,
                                       err_msg=f"{kernel} {fn.__name__}")
            jax.tree_util.tree_map_with_path(functools.partial(_close, label=f"{kernel} {fn.__name__}"), grads,
                                             want_grads)


def _close(path, got, want, label=""):
    """Gradient atol 1e-6 of the leaf's largest entry, as test_shared_prompt.py (|g| reaches ~50 there)."""
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want, atol=1e-6 * scale, rtol=1e-5,
                               err_msg=f"{label} {jax.tree_util.keystr(path)}")


def test_packed_rows(cudnn_as_reference):
    """Segment ids have no `jax.nn.dot_product_attention` argument: with "cudnn" packed rows run the blocked
    core (identical bits to "xla"); splash takes them (segment ids and padding as segment -1), within 1e-5."""
    cfg = TransformerConfig.tiny()
    params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param).to_pure_dict()
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 64, (2, 12)), jnp.int32)
    segments = jnp.asarray([[0] * 5 + [1] * 7, [0] * 9 + [1] * 3], jnp.int32)
    mask = jnp.asarray(np.arange(12)[None] < np.array([[12], [10]]))  # the second row ends in padding
    kernels = ("cudnn", "splash", "xla")

    @jax.jit  # one program for the three kernels (op-by-op dispatch compiled every primitive on its own)
    def forward(p, tokens, mask, segments):
        return [Transformer.from_params(cfg.replace(attention=kernel), p).forward(
            tokens, mask_BL=mask, segment_BL=segments).logits for kernel in kernels]

    logits = dict(zip(kernels, (np.asarray(x) for x in forward(params, tokens, mask, segments)), strict=True))
    np.testing.assert_array_equal(logits["cudnn"], logits["xla"])
    real = np.asarray(mask)
    np.testing.assert_allclose(logits["splash"][real], logits["xla"][real], **VALUES)


def test_splash_queries_padded_past_a_whole_block_of_real_keys():
    """S = SPLASH_BLOCK real keys and L = 5 queries: the 123 queries padded up to the block see no key of their
    own (padding) segment at all. Their rows must not turn into NaN that the backward pass would spread into
    dK and dV: values and gradients equal the blocked core's."""
    rng = np.random.default_rng(4)
    slots, length = attention_fused.SPLASH_BLOCK, 5
    q = jnp.asarray(rng.normal(size=(1, length, 1, 2, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(1, 1, slots, H)), jnp.float32) for _ in range(2))
    mask = jnp.ones((1, slots), bool)

    def grads(kernel, *qkv):
        loss = lambda q, k, v: jnp.sum(jnp.sin(attend(q, k, v, KeyMask(mask, kernel=kernel), causal=True)))  # noqa
        return jax.grad(loss, argnums=(0, 1, 2))(*qkv)

    both = jax.jit(lambda *qkv: (grads("splash", *qkv), grads("xla", *qkv)))  # one program
    for got, want in zip(*both(q, k, v), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
