"""KV cache: prefill + token-by-token decode (inside jit / fori_loop) reproduces the full-sequence forward.

Compiling is this file's time, so the forwards of a test run in one jitted program (the left-padding test:
one per norm, for all its decode variants and both reference forwards); run eagerly, every forward recompiled
its layer scan.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import KVCache, Transformer, TransformerConfig

PROMPT, NEW = 5, 4
DECODE_CASES = [  # (norm, explicit positions, per-layer decode)
    ("pre", False, False), ("pre", True, False), ("siamese", False, False),
    ("pre", False, True), ("post", True, True), ("siamese", False, True),
]


def _prefill_then_decode(model, prompt_BP, mask_BP, new_BT, cache, explicit_positions, per_layer):
    """Prefill the prompt, then feed `new_BT` one token at a time in a fori_loop. Returns all logits.

    per_layer: decode on `layer_states()` with the cache unstacked (the CPU rollout's layout)."""
    positions = jnp.maximum(jnp.cumsum(mask_BP, -1) - 1, 0) if explicit_positions else None
    out = model.forward(prompt_BP, positions, mask_BP, cache=cache)
    start_B = jnp.sum(mask_BP, -1)
    layers = model.layer_states() if per_layer else None

    def body(t, carry):
        logits_BTV, cache = carry
        pos = (start_B + t)[:, None] if explicit_positions else None
        step = model.forward(new_BT[:, t][:, None], pos, jnp.ones((new_BT.shape[0], 1), bool), cache=cache,
                             layers=layers)
        return logits_BTV.at[:, t].set(step.logits[:, 0]), step.cache

    init = (jnp.zeros(new_BT.shape + (model.cfg.vocab_size,), jnp.float32),
            out.cache.unstack() if per_layer else out.cache)
    logits_BTV, cache = jax.lax.fori_loop(0, new_BT.shape[1], body, init)
    return out.logits, logits_BTV, cache


@functools.partial(jax.jit, static_argnums=(0, 4))
def _references_and_decodes(graphdef, state, tokens, prompt_mask, flags):
    """(full-sequence logits of the left-padded `tokens`, logits of row 2 alone without its padding, and per
    (explicit, per_layer) of `flags` the `_prefill_then_decode` results), in one program."""
    model = nnx.merge(graphdef, state)
    full_mask = jnp.concatenate([prompt_mask, jnp.ones((3, NEW), bool)], axis=1)
    full = model.forward(tokens, None, full_mask).logits
    alone = model(tokens[2:3, PROMPT - 1:])[0]
    decodes = [_prefill_then_decode(model, tokens[:, :PROMPT], prompt_mask, tokens[:, PROMPT:],
                                    KVCache.init(model.cfg, 3, PROMPT + NEW + 2, "float32"), *f) for f in flags]
    return full, alone, decodes


@functools.cache
def _decode_results(norm):
    """(tokens, prompt mask, {(explicit, per_layer): (prefill, decoded, cache)}, full logits, row 2's logits
    alone) for the model of `norm` and every DECODE_CASES entry of it: rows of length 5, 3, 1."""
    cfg = TransformerConfig.tiny(norm=norm, family="qwen3", qk_norm=True)
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size, (3, PROMPT + NEW)).astype(np.int32)
    prompt_mask = np.arange(PROMPT)[None] >= np.array([0, 2, 4])[:, None]  # rows of length 5, 3, 1
    tokens[:, :PROMPT] = np.where(prompt_mask, tokens[:, :PROMPT], 0)
    flags = tuple((explicit, per_layer) for n, explicit, per_layer in DECODE_CASES if n == norm)
    graphdef, state = nnx.split(model)
    full, alone, decodes = _references_and_decodes(graphdef, state, jnp.asarray(tokens), jnp.asarray(prompt_mask),
                                                   flags)
    return tokens, prompt_mask, dict(zip(flags, decodes)), np.asarray(full), np.asarray(alone)


@pytest.mark.parametrize("norm,explicit,per_layer", DECODE_CASES)
def test_decode_matches_full_forward_with_left_padding(norm, explicit, per_layer):
    tokens, prompt_mask, decodes, full, alone = _decode_results(norm)
    prefill, decoded, cache = decodes[explicit, per_layer]
    full_mask = np.concatenate([prompt_mask, np.ones((3, NEW), bool)], axis=1)
    assert cache.per_layer == per_layer
    np.testing.assert_allclose(np.asarray(prefill)[prompt_mask], full[:, :PROMPT][prompt_mask],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(decoded), full[:, PROMPT:], atol=1e-5, rtol=0)
    assert int(cache.index) == PROMPT + NEW
    expected_valid = np.concatenate([full_mask, np.zeros((3, 2), bool)], axis=1)
    np.testing.assert_array_equal(np.asarray(cache.valid_BS), expected_valid)
    # A left-padded row decodes exactly like the same row without padding.
    np.testing.assert_allclose(np.asarray(decoded)[2], alone[1:], atol=1e-5, rtol=0)


PROMPT_2x3 = jnp.array([[0, 5, 6], [7, 8, 9]], jnp.int32)
MASK_2x3 = jnp.array([[0, 1, 1], [1, 1, 1]], bool)


def test_repeat_makes_contiguous_copies_that_decode_identically():
    cfg = TransformerConfig.tiny()
    model = Transformer(cfg, rngs=nnx.Rngs(2))

    @nnx.jit
    def prefill_repeat_step(model):  # one program
        out = model.forward(PROMPT_2x3, None, MASK_2x3, cache=KVCache.init(cfg, 2, 6))
        rep = out.cache.repeat(3)
        step = model.forward(jnp.full((6, 1), 11, jnp.int32), cache=rep)
        single = model.forward(jnp.full((2, 1), 11, jnp.int32), cache=out.cache)
        return out, rep, step, single

    out, rep, step, single = prefill_repeat_step(model)
    assert rep.k.shape == (cfg.num_layers, 6, cfg.num_kv_heads, 6, cfg.head_dim)
    np.testing.assert_array_equal(np.asarray(rep.k[:, 3]), np.asarray(out.cache.k[:, 1]))
    np.testing.assert_array_equal(np.asarray(rep.valid_BS), np.repeat(np.asarray(out.cache.valid_BS), 3, 0))
    assert int(rep.index) == 3
    np.testing.assert_allclose(np.asarray(step.logits), np.repeat(np.asarray(single.logits), 3, 0), atol=1e-6)


def test_per_layer_form_holds_and_updates_the_same_slots():
    """unstack / repeat / append in the per-layer form equal the stacked cache's, slot for slot."""
    cfg = TransformerConfig.tiny(num_layers=3)
    model = Transformer(cfg, rngs=nnx.Rngs(3))
    tok = jnp.full((4, 1), 11, jnp.int32)

    @nnx.jit
    def prefill_and_steps(model):  # one program: the prefill, and one step on each form of its cache
        stacked = model.forward(PROMPT_2x3, None, MASK_2x3, cache=KVCache.init(cfg, 2, 6)).cache.repeat(2)
        return (stacked, model.forward(tok, cache=stacked.unstack()).logits,
                model.forward(tok, cache=stacked).logits)

    stacked, split_logits, stacked_logits = prefill_and_steps(model)
    split = stacked.unstack()
    assert split.per_layer and not stacked.per_layer and split.unstack() is split
    assert len(split.k) == cfg.num_layers and split.k[0].shape == stacked.k.shape[1:]
    for i in range(cfg.num_layers):
        np.testing.assert_array_equal(np.asarray(split.layer(i)[1]), np.asarray(stacked.v[i]))
    rng = np.random.default_rng(0)
    k_new, v_new = (jnp.asarray(rng.normal(size=(cfg.num_layers, 4, 2, 1, 8)), jnp.float32) for _ in range(2))
    valid = stacked.valid_BS.at[:, 3].set(True)
    a = stacked.append(k_new, v_new, valid, 1)
    b = split.append(tuple(k_new), tuple(v_new), valid, 1)
    np.testing.assert_array_equal(np.stack([np.asarray(x) for x in b.k]), np.asarray(a.k))
    np.testing.assert_array_equal(np.stack([np.asarray(x) for x in b.v]), np.asarray(a.v))
    np.testing.assert_array_equal(np.asarray(a.k[:, :, :, 3:4]), np.asarray(k_new))
    assert int(a.index) == int(b.index) == 4
    # A per-layer cache without explicit layer states still decodes like the stacked one.
    np.testing.assert_allclose(np.asarray(split_logits), np.asarray(stacked_logits), atol=1e-6, rtol=0)
    rep = split.repeat(2)
    np.testing.assert_array_equal(np.asarray(rep.k[1][5]), np.asarray(stacked.k[1, 2]))


def test_cache_init_layout_and_bad_input():
    cfg = TransformerConfig.tiny()
    cache = KVCache.init(cfg, 2, 7, "bfloat16")
    assert cache.k.shape == cache.v.shape == (2, 2, 2, 7, 8) and cache.k.dtype == jnp.bfloat16
    assert cache.valid_BS.shape == (2, 7) and not cache.valid_BS.any() and int(cache.index) == 0
    assert KVCache.init(cfg, 1, 3).k.dtype == jnp.float32
    with pytest.raises(ValueError, match="capacity"):
        KVCache.init(cfg, 2, 0)
    with pytest.raises(ValueError, match="num >= 1"):
        cache.repeat(0)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="does not fit"):
        model.forward(jnp.zeros((2, 8), jnp.int32), cache=KVCache.init(cfg, 2, 7))
