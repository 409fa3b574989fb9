"""bf16 params/compute stay close to fp32; remat policies change memory, not values or gradients.

Compiling is this file's time (a tiny model's value-and-gradient program takes ~3-4 s of CPU to compile), so
each program is compiled once and its results shared: `_value_and_grad(cfg)` per model config (the scanned,
no-remat SiameseNorm program is the baseline of both the remat and the unrolled test), one program for
both norms' fp32 and bf16 forwards, one per norm for the scanned and unrolled decodes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import KVCache, Transformer, TransformerConfig

TOKENS = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 7)), jnp.int32)
BF16_TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)
NORMS = ("pre", "siamese")  # of the bf16 test


def _qwen3(**changes):
    """The tiny Qwen3-style config (QK-norm) these tests vary."""
    return TransformerConfig.tiny(family="qwen3", qk_norm=True, **changes)


@functools.cache
def _params(cfg, seed=0):
    """Random params of `cfg` (remat and scan_layers do not enter the init), made once."""
    return nnx.state(Transformer(cfg, rngs=nnx.Rngs(seed)), nnx.Param).to_pure_dict()


def _loss(p, c):
    return jnp.mean(jax.nn.log_softmax(Transformer.from_params(c, p)(TOKENS))[..., 3])


_jit_value_and_grad = jax.jit(jax.value_and_grad(_loss), static_argnums=1)


@functools.cache
def _value_and_grad(cfg):
    """(its jaxpr as text, loss, gradients) of `_loss` under `cfg`, at the seed-2 params of `cfg`'s norm:
    traced and compiled once, shared by every test that compares against this config."""
    params = _params(cfg.replace(remat="none", scan_layers=True), seed=2)
    traced = _jit_value_and_grad.trace(params, cfg)
    value, grad = traced.lower().compile()(params)
    return str(traced.jaxpr), value, grad


@functools.cache
def _bf16_forwards():
    """{norm: (fp32 logits, bf16 model, its `forward(return_hidden=True)`)} of BF16_TOKENS for each norm of
    NORMS, from the same seed-0 params; all four forwards in one jitted program."""
    models = {}
    for norm in NORMS:
        cfg32 = _qwen3(norm=norm)
        params = _params(cfg32)
        models[norm] = (Transformer.from_params(cfg32, params),
                        Transformer.from_params(cfg32.replace(dtype="bfloat16", param_dtype="bfloat16"), params))
    outs = nnx.jit(lambda ms: [[m.forward(BF16_TOKENS, return_hidden=True) for m in pair] for pair in ms])(
        list(models.values()))
    return {norm: (np.asarray(out32.logits), pair[1], out16) for (norm, pair), (out32, out16)
            in zip(models.items(), outs)}


@pytest.mark.parametrize("norm", NORMS)
def test_bf16_forward_is_close_to_fp32(norm):
    ref, model16, out = _bf16_forwards()[norm]
    assert model16.layers.mlp.up_proj.kernel[...].dtype == jnp.bfloat16
    assert out.logits.dtype == jnp.float32 and out.hidden.dtype == jnp.bfloat16
    # bf16 has an 8-bit significand (relative rounding 2^-9 ≈ 0.2% per op); through 2 blocks the logits
    # (|logit| <= ~0.5 here) drift by a few 1e-3. This loose bound applies to this dtype test only.
    err = np.max(np.abs(np.asarray(out.logits) - ref))
    assert err < 2e-2 * max(1.0, np.max(np.abs(ref))), err
    assert np.corrcoef(np.asarray(out.logits).ravel(), ref.ravel())[0, 1] > 0.999


@pytest.mark.parametrize("remat", ["full", "dots", "mlp", "attention"])
def test_remat_keeps_logits_and_gradients(remat):
    cfg = _qwen3(norm="siamese")
    program, val, grad = _value_and_grad(cfg.replace(remat=remat))
    assert "checkpoint" in program or "remat" in program
    _, base_val, base_grad = _value_and_grad(cfg)
    np.testing.assert_allclose(val, base_val, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), grad, base_grad)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) > 0


@functools.partial(jax.jit, static_argnums=0)
def _decodes(cfgs, params):
    """Per config of `cfgs`: (prefill logits of TOKENS[:, :6], logits of one decode step of TOKENS[:, 6:],
    the cache after it), all with `params`, in one program."""
    results = []
    for c in cfgs:
        model = Transformer.from_params(c, params)
        out = model.forward(TOKENS[:, :6], cache=KVCache.init(c, 2, 9))
        step = model.forward(TOKENS[:, 6:], cache=out.cache)
        results.append((out.logits, step.logits, step.cache))
    return results


@pytest.mark.parametrize("norm,remat", [("pre", "none"), ("siamese", "none"), ("post", "dots")])
def test_unrolled_layers_equal_scanned_logits_gradients_and_decode(norm, remat):
    cfg = _qwen3(norm=norm, remat=remat)
    unrolled = cfg.replace(scan_layers=False)
    (program, base_val, base_grad), (unrolled_program, val, grad) = _value_and_grad(cfg), _value_and_grad(unrolled)
    # The unrolled program (forward and backward) has no layer loop; the scanned one has one.
    assert "scan" not in unrolled_program
    assert "scan" in program
    np.testing.assert_allclose(val, base_val, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), grad, base_grad)

    (p0, s0, c0), (p1, s1, c1) = _decodes((cfg, unrolled), _params(cfg.replace(remat="none"), seed=2))
    np.testing.assert_allclose(p1, p0, atol=1e-6)
    np.testing.assert_allclose(s1, s0, atol=1e-6)
    np.testing.assert_allclose(c1.k, c0.k, atol=1e-6)
    np.testing.assert_allclose(c1.v, c0.v, atol=1e-6)


def test_loaded_model_takes_the_configs_execution_switches(tmp_path):
    from jaxrl.io import hf
    from jaxrl.io.build import build_model
    from jaxrl.config import ModelConfig

    hf.save_pretrained(Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0)), tmp_path / "m")
    model = build_model(ModelConfig(preset=None, hf_path=str(tmp_path / "m"), remat="full", scan_layers=False),
                        vocab_size=64, seed=0)
    assert model.cfg.remat == "full" and model.cfg.scan_layers is False
    with pytest.raises(ValueError, match="scan_layers must be a bool"):
        TransformerConfig.tiny(scan_layers="no")
