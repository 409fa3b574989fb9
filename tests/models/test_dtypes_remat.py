"""bf16 params/compute stay close to fp32; remat policies change memory, not values or gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig


def _params(cfg, seed=0):
    return nnx.state(Transformer(cfg, rngs=nnx.Rngs(seed)), nnx.Param).to_pure_dict()


@pytest.mark.parametrize("norm", ["pre", "siamese"])
def test_bf16_forward_is_close_to_fp32(norm):
    cfg32 = TransformerConfig.tiny(norm=norm, family="qwen3", qk_norm=True)
    cfg16 = cfg32.replace(dtype="bfloat16", param_dtype="bfloat16")
    params = _params(cfg32)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)
    ref = np.asarray(Transformer.from_params(cfg32, params)(tokens))
    model16 = Transformer.from_params(cfg16, params)
    assert model16.layers.mlp.up_proj.kernel[...].dtype == jnp.bfloat16
    out = model16.forward(tokens, return_hidden=True)
    assert out.logits.dtype == jnp.float32 and out.hidden.dtype == jnp.bfloat16
    # bf16 has an 8-bit significand (relative rounding 2^-9 ≈ 0.2% per op); through 2 blocks the logits
    # (|logit| <= ~0.5 here) drift by a few 1e-3. This loose bound applies to this dtype test only.
    err = np.max(np.abs(np.asarray(out.logits) - ref))
    assert err < 2e-2 * max(1.0, np.max(np.abs(ref))), err
    assert np.corrcoef(np.asarray(out.logits).ravel(), ref.ravel())[0, 1] > 0.999


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_keeps_logits_and_gradients(remat):
    cfg = TransformerConfig.tiny(norm="siamese")
    params = _params(cfg, seed=1)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 6)), jnp.int32)

    def loss(p, c):
        model = Transformer.from_params(c, p)
        return jnp.mean(jax.nn.log_softmax(model(tokens))[..., 0])

    program = str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(params, cfg.replace(remat=remat)))
    assert "checkpoint" in program or "remat" in program
    base_val, base_grad = jax.value_and_grad(loss)(params, cfg)
    val, grad = jax.value_and_grad(loss)(params, cfg.replace(remat=remat))
    np.testing.assert_allclose(val, base_val, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), grad, base_grad)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) > 0
