"""Logits parity with transformers (torch fp32) and exact HF -> jaxrl -> HF round trips (tiny models)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.models import Transformer, hf_io, testing

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.hf

ATOL = 1e-4
CONFIGS = sorted(testing.TINY_CONFIGS)


def _tokens(vocab, shape, seed):
    return np.random.default_rng(seed).integers(3, vocab, size=shape).astype(np.int32)


@pytest.fixture(scope="module", params=CONFIGS)
def pair(request):
    """(cfg, hf torch model, HF state dict as numpy, jaxrl model built from it)."""
    cfg = testing.TINY_CONFIGS[request.param]
    hf_model = testing.random_hf_model(cfg, seed=len(request.param))
    sd = testing.state_dict_numpy(hf_model)
    model = Transformer.from_params(cfg, hf_io.hf_to_params(cfg, sd.__getitem__))
    return cfg, hf_model, sd, model


def _hf_logits(hf_model, tokens, mask=None, positions=None):
    kwargs = {}
    if mask is not None:
        kwargs["attention_mask"] = torch.from_numpy(mask.astype(np.int64))
    if positions is not None:
        kwargs["position_ids"] = torch.from_numpy(positions.astype(np.int64))
    with torch.no_grad():
        return hf_model(torch.from_numpy(tokens.astype(np.int64)), **kwargs).logits.numpy()


def test_unpadded_logits_match_transformers(pair):
    cfg, hf_model, _, model = pair
    tokens = _tokens(cfg.vocab_size, (2, 11), 0)
    ours = np.asarray(model(jnp.asarray(tokens)))
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, _hf_logits(hf_model, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_logits_match_transformers_at_real_positions(pair, side):
    cfg, hf_model, _, model = pair
    tokens = _tokens(cfg.vocab_size, (3, 9), 1)
    lengths = np.array([9, 6, 3])
    cols = np.arange(9)[None, :]
    mask = cols >= (9 - lengths)[:, None] if side == "left" else cols < lengths[:, None]
    tokens = np.where(mask, tokens, 0)
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    out = model.forward(jnp.asarray(tokens), None, jnp.asarray(mask))
    ref = _hf_logits(hf_model, tokens, mask, positions)
    ours = np.asarray(out.logits)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=ATOL, rtol=0)
    assert np.isfinite(ours).all()
    # A padded row equals its unpadded forward (padding is invisible to real tokens).
    alone = np.asarray(model(jnp.asarray(tokens[1][mask[1]][None])))[0]
    np.testing.assert_allclose(ours[1][mask[1]], alone, atol=1e-5, rtol=0)


def test_round_trip_is_exact(pair):
    cfg, _, sd, model = pair
    back = dict(hf_io.params_to_hf(cfg, hf_io.hf_to_params(cfg, sd.__getitem__)))
    expected = {k: v for k, v in sd.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    assert sorted(back) == sorted(expected)
    for name, value in expected.items():
        assert back[name].shape == value.shape, name
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    assert hf_io.hf_shapes(cfg) == {k: v.shape for k, v in expected.items()}


def test_model_params_export_to_the_same_tensors(pair):
    """nnx state of the loaded model exports back to the HF state dict (layout glue is consistent)."""
    from flax import nnx

    cfg, _, sd, model = pair
    params = nnx.state(model, nnx.Param).to_pure_dict()
    for name, value in hf_io.params_to_hf(cfg, params):
        np.testing.assert_array_equal(value, sd[name], err_msg=name)


def test_rope_inverse_frequencies_equal_transformers(pair):
    """theta and Llama-3 scaling change logits only slightly at short lengths, so compare the frequencies."""
    from jaxrl.models.layers import rope_inv_freq

    cfg, hf_model, _, _ = pair
    ours = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    ref = hf_model.model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=0)
    plain = rope_inv_freq(cfg.head_dim, 10000.0, None)
    changed = cfg.rope_theta != 10000.0 or cfg.rope_scaling is not None
    assert changed == (not np.allclose(ours, plain, rtol=1e-3))
