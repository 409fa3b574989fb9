"""What a training forward keeps for the backward pass: no [.., L, L] float tensor (attention scores or
probabilities) with or without remat. The dense softmax kept two [B, K, G, L, L] float32 tensors per layer;
`jaxrl.models.attention.attend` keeps q, k, v, the [B, L] key mask (`KeyMask`: no [B, L, L] visibility,
bool or not) and per-query statistics, and recomputes the probabilities in the backward pass. This is the memory lever for long sequences
(benchmarks/RESULTS.md, long prompts); its values and gradients are checked in test_attention_core.py, remat's
in test_dtypes_remat.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig, layers
from jaxrl.models.attention import masked_scores
from tests.models._dense_attention import dense_visibility

L = 24


def _residuals(remat: str, scan_layers: bool, **changes) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of the arrays the backward pass of a forward + loss keeps (the VJP closure's leaves).

    Traced only (`jax.eval_shape` on abstract parameters), as under jit: which residuals the VJP keeps does
    not depend on the values, and running the model op by op only added compile time."""
    cfg = TransformerConfig.tiny(norm="pre", remat=remat, scan_layers=scan_layers, **changes)
    params = nnx.state(Transformer.abstract(cfg), nnx.Param).to_pure_dict()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, L)), jnp.int32)

    def loss(p):
        return jnp.mean(jax.nn.log_softmax(Transformer.from_params(cfg, p)(tokens))[..., 0])

    pullback = jax.eval_shape(lambda p: jax.vjp(loss, p)[1], params)
    return [(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(pullback) if hasattr(leaf, "shape")]


def _square(kept):
    """Residuals with two axes of length L, the visibility mask included ([B, L, L] bool was kept per layer
    before `KeyMask`: 1 GiB per row at 32k tokens)."""
    return [(s, d) for s, d in kept if list(s).count(L) >= 2]


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("remat", ["none", "dots", "full", "mlp", "attention"])
def test_no_square_attention_residuals(remat, scan_layers):
    kept = _residuals(remat, scan_layers)
    assert any(s[-1] == 8 for s, _ in kept), "no per-head residuals found: the check would pass vacuously"
    assert not _square(kept), (remat, _square(kept))


def test_the_check_sees_square_residuals(monkeypatch):
    """The dense softmax (the path `attend` replaced) keeps [B, K, G, L, L] floats; `_square` finds them."""
    def dense(q_BLKGH, k_BKSH, v_BKSH, visible_BLS, causal=False):
        visible_BLS = dense_visibility(visible_BLS, q_BLKGH.shape[1])
        probs = jax.nn.softmax(masked_scores(q_BLKGH, k_BKSH, visible_BLS), axis=-1).astype(v_BKSH.dtype)
        return jnp.einsum("BKGLS,BKSH->BLKGH", probs, v_BKSH)

    monkeypatch.setattr(layers, "attend", dense)
    assert _square(_residuals("none", scan_layers=True))


def test_mlp_keeps_only_its_two_projections():
    """The SwiGLU MLP keeps gate and up ([B, L, F] each) for the backward pass and recomputes silu(gate) ⊙ up:
    two F-wide float residuals per layer, not three (the dense MLP also kept the product)."""
    f = 96  # an MLP width no other tensor of the tiny model has
    kept = _residuals("none", scan_layers=False, mlp_dim=f)
    acts = [shape for shape, _ in kept if shape == (2, L, f)]
    assert len(acts) == 2 * TransformerConfig.tiny().num_layers, acts


def test_remat_mlp_keeps_no_mlp_projection():
    """`model.remat: mlp` recomputes gate and up in the backward pass: no F-wide residual is kept, while every
    other residual of the layer stays (the same count of D-wide ones as without remat)."""
    f = 96
    kept = _residuals("mlp", scan_layers=False, mlp_dim=f)
    assert [s for s, _ in kept if s == (2, L, f)] == []  # (the weights stay: the recompute reads them)
    wide = lambda k: sorted(s for s, _ in k if s[:2] == (2, L) and s[-1] == TransformerConfig.tiny().hidden_size)
    assert wide(kept) == wide(_residuals("none", scan_layers=False, mlp_dim=f))


def test_mlp_values_and_gradients_equal_the_plain_swiglu():
    cfg = TransformerConfig.tiny(norm="pre")
    mlp = layers.MLP(cfg.hidden_size, cfg.mlp_dim, rngs=nnx.Rngs(1))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, L, cfg.hidden_size)), jnp.float32)

    def plain(m, x):
        return m.down_proj(jax.nn.silu(m.gate_proj(x)) * m.up_proj(x))

    def scalar(fn):
        return lambda m, x: jnp.sum(jnp.sin(fn(m, x)))

    np.testing.assert_allclose(mlp(x), plain(mlp, x), rtol=1e-6, atol=1e-7)
    got = nnx.grad(scalar(lambda m, x: m(x)), argnums=(0, 1))(mlp, x)
    want = nnx.grad(scalar(plain), argnums=(0, 1))(mlp, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_pre_norm_block_keeps_only_its_two_residual_streams():
    """Each pre-norm runs inside its sublayer's checkpoint: per layer, the scan keeps the block input and the
    mid-block stream x + Attn(N₁(x)) ([B, L, D] each) and recomputes N₁, N₂ in the backward pass. Keeping the
    norms' outputs and normalised inputs as well made six such residuals per layer."""
    d = 40  # a hidden size no other tensor of the tiny model has
    cfg = TransformerConfig.tiny()
    kept = _residuals("none", scan_layers=True, hidden_size=d)
    streams = [shape for shape, dtype in kept if shape == (cfg.num_layers, 2, L, d)]
    assert len(streams) == 2, kept


def _norm_sublayer_inputs(qk_norm: bool):
    cfg = TransformerConfig.tiny(norm="pre", qk_norm=qk_norm)
    rngs = nnx.Rngs(2)
    norm = layers.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    norm.weight[...] = jnp.asarray(np.random.default_rng(3).uniform(0.5, 1.5, cfg.hidden_size), jnp.float32)
    attn = layers.Attention(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, qkv_bias=False,
                            qk_norm=qk_norm, eps=cfg.rms_norm_eps, rngs=rngs)
    mlp = layers.MLP(cfg.hidden_size, cfg.mlp_dim, rngs=rngs)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, L, cfg.hidden_size)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(L), (2, L))
    cos, sin = layers.rope_tables(positions, layers.rope_inv_freq(cfg.head_dim, cfg.rope_theta, None),
                                  jnp.float32)
    visible = jnp.broadcast_to(jnp.tril(jnp.ones((L, L), bool)), (2, L, L)).at[1, :, :5].set(False)
    return norm, attn, mlp, x, (cos, sin, visible)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_norm_inside_the_checkpoints_equals_the_norm_outside(qk_norm):
    """Attn(x, norm=N) and MLP(x, norm=N) against the previous path N(x) fed to the sublayer with nothing
    recomputed (projections, RoPE, `attend`, o_proj; gate, up, down): values and gradients, fp32."""
    norm, attn, mlp, x, (cos, sin, visible) = _norm_sublayer_inputs(qk_norm)

    def plain(norm, attn, mlp, x):
        q, k, v = attn._project(norm(x), cos, sin)
        b, l, kv, g, h = q.shape
        h_BLD = x + attn.o_proj(layers.attend(q, k, v, visible, causal=True).reshape(b, l, kv * g, h))
        return h_BLD + mlp.down_proj(jax.nn.silu(mlp.gate_proj(norm(h_BLD))) * mlp.up_proj(norm(h_BLD)))

    def inside(norm, attn, mlp, x):
        h_BLD = x + attn(x, cos, sin, visible, norm=norm)[0]
        return h_BLD + mlp(h_BLD, norm=norm)

    def scalar(fn):
        return lambda *args: jnp.sum(jnp.sin(fn(*args)))

    np.testing.assert_allclose(inside(norm, attn, mlp, x), plain(norm, attn, mlp, x), rtol=1e-6, atol=1e-6)
    got = nnx.grad(scalar(inside), argnums=(0, 1, 2, 3))(norm, attn, mlp, x)
    want = nnx.grad(scalar(plain), argnums=(0, 1, 2, 3))(norm, attn, mlp, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_remat_attention_keeps_the_core_output_and_its_statistics_beyond_full():
    """`model.remat: attention` keeps what `full` keeps (each layer's input) plus, per layer, the attention
    core's output [B, L, K, G, H] and its per-query max and normaliser [B, K, G, L, 1]: no q, k, v, no MLP
    product."""
    from collections import Counter
    cfg = TransformerConfig.tiny()
    b, k, g, h = 2, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    full = Counter(s for s, _ in _residuals("full", scan_layers=False))
    kept = Counter(s for s, _ in _residuals("attention", scan_layers=False))
    assert kept - full == Counter({(b, L, k, g, h): cfg.num_layers, (b, k, g, L, 1): 2 * cfg.num_layers})
    assert not full - kept


@pytest.mark.parametrize("scan_layers", [True, False])
def test_remat_attention_does_not_recompute_the_attention_forward(scan_layers):
    """The backward of `remat: attention` runs as many exponentials as without remat (the softmax of the
    backward pass only); `full` runs the attention forward again (more)."""
    def exps(remat):
        cfg = TransformerConfig.tiny(norm="pre", remat=remat, scan_layers=scan_layers)
        params = nnx.state(Transformer.abstract(cfg), nnx.Param).to_pure_dict()
        tokens = jnp.zeros((2, L), jnp.int32)
        loss = lambda p: jnp.sum(Transformer.from_params(cfg, p)(tokens) ** 2)
        return jax.jit(jax.grad(loss)).lower(params).as_text().count("stablehlo.exponential")

    assert exps("attention") == exps("none") < exps("full")
