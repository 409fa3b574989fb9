"""Continuous batching (`jaxrl.sampling.continuous`, issue 33 item 1): S decode slots refilled as rows stop.

The same seed gives the same tokens, log-probs, lengths and finished flags as the static engine, bit for bit,
whatever the number of slots (greedy and sampled with top-k / top-p, EOS and per-row length budgets stopping
rows at mixed lengths, per-layer and scanned decode, rows sharded over 8 devices); a long-tailed batch takes
about Σ lengths / S decode steps instead of the longest row's; draining the queue never recompiles.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl import sampling
from jaxrl.models import KVCache, Transformer, TransformerConfig
from jaxrl.sampling import continuous

EOS = 3
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(4, 60, size=int(RNG.integers(2, 9))).tolist() for _ in range(6)]
BUDGETS = RNG.integers(1, 20, size=18)  # G = 3: 18 rows


@pytest.fixture(scope="module")
def model():
    return Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))


def _both(model, slots, *, per_layer=True, **kw):
    args = dict(max_new_tokens=20, num_samples=3, seed=4, eos_ids=(EOS,), max_new_per_row=BUDGETS,
                per_layer=per_layer, **kw)
    return sampling.generate(model, PROMPTS, **args), sampling.generate(model, PROMPTS, engine="continuous",
                                                                          slots=slots, **args)


def _assert_same_rows(static, cont):
    for field in ("tokens", "logprobs", "lengths", "finished", "prompt_index"):
        np.testing.assert_array_equal(np.asarray(getattr(cont, field)), np.asarray(getattr(static, field)),
                                      err_msg=field)


@pytest.mark.parametrize("kw,slots,per_layer", [
    (dict(temperature=0.0), 5, True),
    (dict(temperature=1.0), 2, True),
    (dict(temperature=0.8, top_k=10, top_p=0.9), 5, True),
    (dict(temperature=1.0), 7, False),  # the layer scan, the stacked cache's per-row writes
])
def test_same_rows_as_the_static_engine(model, kw, slots, per_layer):
    static, cont = _both(model, slots, per_layer=per_layer, **kw)
    _assert_same_rows(static, cont)
    lengths, finished = np.asarray(static.lengths), np.asarray(static.finished)
    if kw["temperature"]:  # EOS stopped some rows, budgets the others (the greedy rows never emit this EOS)
        assert finished.any() and (~finished).any()
    assert np.all(lengths <= BUDGETS) and len(set(lengths.tolist())) > 5  # mixed lengths
    assert np.all(np.asarray(static.tokens)[np.arange(18), lengths - 1][finished] == EOS)


def test_refilled_slots_shorten_the_decode_loop(model):
    """The static batch runs until its longest row ends; S slots run about Σ lengths / S steps."""
    static, cont = _both(model, 4, temperature=1.0)
    lengths = np.asarray(static.lengths)
    assert int(static.decode_steps) == lengths.max()
    steps = int(cont.decode_steps)
    # each row's slot is busy for its length, plus at most one idle step between rows while it is refilled
    assert math.ceil(lengths.sum() / 4) <= steps <= math.ceil((lengths + 1).sum() / 4) + lengths.max()
    assert steps * 4 < 0.75 * lengths.max() * 18  # fewer row-steps than the static batch computes


def test_same_rows_on_eight_devices(model):
    assert len(jax.devices()) == 8
    mesh = Mesh(np.array(jax.devices()), ("data",))
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
    prompts = PROMPTS + [[5, 6, 7], [8]]  # 8 prompts: one per device
    args = dict(max_new_tokens=20, num_samples=3, seed=9, eos_ids=(EOS,), temperature=1.0,
                max_new_per_row=np.resize(BUDGETS, 24))
    single = sampling.generate(model, prompts, **args)
    sharded = sampling.generate_from_state(graphdef, state, prompts, engine="continuous", slots=16,
                                           batch_sharding=NamedSharding(mesh, PartitionSpec("data")), **args)
    assert len(sharded.tokens.sharding.device_set) == 8
    _assert_same_rows(single, sharded)


def test_draining_the_queue_never_recompiles(model):
    sampling.generate(model, PROMPTS, max_new_tokens=20, num_samples=3, seed=0, engine="continuous", slots=5)
    before = continuous.compile_count()
    for seed, budgets in ((1, BUDGETS), (2, np.full(18, 20)), (3, 1 + BUDGETS // 4)):
        prompts = [p[::-1] for p in PROMPTS] if seed % 2 else PROMPTS  # same bucket, other prompts
        sampling.generate(model, prompts, max_new_tokens=20, num_samples=3, seed=seed, engine="continuous",
                          slots=5, max_new_per_row=budgets, temperature=0.7)
    assert continuous.compile_count() == before


def test_admission_fills_free_slots_in_row_order():
    row_S = np.array([-1, 7, -1, -1, 2], np.int32)
    admit, rows = continuous.admission(row_S, np.int32(9), 11)
    np.testing.assert_array_equal(admit, [True, False, True, False, False])  # rows 9 and 10 remain
    np.testing.assert_array_equal(rows, [9, 7, 10, -1, 2])


def test_per_row_cache_writes_each_row_at_its_own_slot():
    cfg = TransformerConfig.tiny()
    cache = KVCache.init(cfg, 3, 6).with_row_index(np.array([0, 4, 2]))
    new = np.ones((cfg.num_layers, 3, cfg.num_kv_heads, 1, cfg.head_dim), np.float32)
    out = cache.append(new, new, np.array(cache.valid_BS), 1)
    written = np.asarray(out.k)[0, :, 0, :, 0]
    np.testing.assert_array_equal(written, np.eye(6)[[0, 4, 2]])
    np.testing.assert_array_equal(out.index, [1, 5, 3])


@pytest.mark.parametrize("kw,match", [
    (dict(engine="continuous", slots=1), r"slots must be in \[2, 6\]"),
    (dict(engine="continuous", slots=7), r"slots must be in \[2, 6\]"),
    (dict(slots=2), "slots \\(2\\) are the continuous engine's"),
    (dict(engine="paged"), "engine must be one of"),
    (dict(max_new_per_row=[4] * 5), r"max_new_per_row must hold 6 budgets in \[1, 4\]"),
    (dict(max_new_per_row=[5] * 6), r"max_new_per_row must hold 6 budgets in \[1, 4\]"),
])
def test_bad_engine_settings_are_clear_errors(model, kw, match):
    with pytest.raises(ValueError, match=match):
        sampling.generate(model, PROMPTS, max_new_tokens=4, **kw)
