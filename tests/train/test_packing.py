"""Sequence packing of SFT rows (`jaxrl.rl.packing`): a packed batch has the padded batch's loss and gradient.

In-process on the tiny model; the blocks test uses a 4-device mesh of the 8 fake CPU devices. The warm start
through the CLI with packing (and 2 processes x 2 devices against 1 x 4) runs in
tests/sharding/test_multihost_cli.py's gdpo case and every test with a warm start.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxrl.rl import packing
from jaxrl.learner.train_step import LossSpec, TrainBatch, loss_and_grad

B, W, T = 8, 10, 14


def _sft_batch(seed: int, rows: int = B, *, W: int = W, T: int = T, longest: int | None = None) -> TrainBatch:
    """Expert rows [prompt left-padded to W | completion right-padded to T] of varied lengths (completions of
    at most `longest` tokens); in two rows part of the completion is not trained on (an environment's tokens
    inside a multi-turn episode)."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((rows, W + T), np.int32)
    mask = np.zeros((rows, W + T), bool)
    cmask = np.zeros((rows, T), bool)
    for b in range(rows):
        p, c = int(rng.integers(1, W + 1)), int(rng.integers(1, (longest or T) + 1))
        tokens[b, W - p:W + c] = rng.integers(3, 64, size=p + c)
        mask[b, W - p:W + c] = True
        cmask[b, :c] = True
        if b in (1, 4) and c > 3:
            cmask[b, 1:3] = False  # environment tokens: in the sequence, not trained on
    zeros = np.zeros((rows, T), np.float32)
    ones = np.ones((rows,), np.float32)
    return TrainBatch(tokens, mask, cmask, zeros, zeros, zeros, ones * 0.2, ones * 0.2, ones)


def test_segments_see_only_themselves_and_restart_positions(model_parts):
    """Two sequences packed into one row give each the hidden states it has alone in a padded row."""
    graphdef, params = model_parts
    model = nnx.merge(graphdef, params)
    rng = np.random.default_rng(0)
    a, b = rng.integers(3, 64, size=7), rng.integers(3, 64, size=5)
    row = np.zeros((1, 16), np.int32)
    row[0, :7], row[0, 7:12] = a, b
    segment = np.zeros((1, 16), np.int32)
    segment[0, :7], segment[0, 7:12] = 1, 2
    forward = jax.jit(lambda t, m, s: model.forward(t, None, m, return_hidden=True, segment_BL=s).hidden)
    packed = np.asarray(forward(row, row > 0, segment))
    alone = jax.jit(lambda t, m: model.forward(t, None, m, return_hidden=True).hidden)
    for seq, cols in ((a, slice(0, 7)), (b, slice(7, 12))):
        ref = np.asarray(alone(seq[None].astype(np.int32), np.ones((1, len(seq)), bool)))[0]
        np.testing.assert_allclose(packed[0, cols], ref, rtol=1e-5, atol=1e-5)
    # without segments the second sequence would read the first: the test can fail
    mixed = np.asarray(alone(row, row > 0))
    assert np.abs(mixed[0, 7:12] - packed[0, 7:12]).max() > 1e-3


def test_pack_keeps_every_token_and_target_once():
    batch = _sft_batch(1)
    n = packing.rows_needed(batch, 1, [0])
    packed = packing.pack(batch, 1, [0], n)
    assert n < B and packed.tokens_BL.shape == (n, W + T)
    seqs = packing.sequences(batch, range(B))
    assert int(np.sum(packed.mask_BL)) == sum(len(t) for t, _ in seqs)
    assert int(np.sum(packed.completion_mask_BT)) == int(np.sum(batch.completion_mask_BT))
    # each segment is one demonstration's tokens, whole and in order, with its own targets
    got = []
    for r in range(n):
        for s in range(1, int(packed.segment_BL[r].max()) + 1):
            cols = np.flatnonzero((packed.segment_BL[r] == s) & packed.mask_BL[r])
            target = np.concatenate([[False], packed.completion_mask_BT[r]])[cols]
            got.append((tuple(packed.tokens_BL[r, cols]), tuple(target)))
    assert sorted(got) == sorted((tuple(t), tuple(m)) for t, m in seqs)
    assert packing.pack(batch, 1, [0], n - 1) is None  # does not fit: the caller runs the batch unpacked


def test_first_fit_decreasing():
    assert packing.first_fit([5, 9, 3, 7, 2], 10) == [[1], [3, 2], [0, 4]]
    with pytest.raises(ValueError, match="does not fit"):
        packing.first_fit([11], 10)


@pytest.mark.parametrize("spec", [LossSpec(policy_weight=0.0, sft_lambda=1.0),
                                  LossSpec(policy_weight=0.0, sft_lambda=1.0, grad_accum=2)])
def test_packed_loss_and_gradient_equal_the_padded_ones(model_parts, spec):
    graphdef, params = model_parts
    batch = _sft_batch(3, W=10, T=30, longest=12)
    rows, width = packing.choose_layout([batch], 1, [0])  # narrower rows than the batch's 40, a row to spare
    packed = packing.pack(batch, 1, [0], rows + rows % 2, width)  # micro-batches of whole rows
    assert packed.tokens_BL.shape[0] < B and width < 40
    fn = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=spec))
    loss, grads, metrics = jax.device_get(fn(params, batch=jax.tree.map(jnp.asarray, batch)))
    loss_p, grads_p, metrics_p = jax.device_get(fn(params, batch=jax.tree.map(jnp.asarray, packed)))
    assert float(loss) > 1.0
    np.testing.assert_allclose(loss_p, loss, rtol=1e-5)
    np.testing.assert_allclose(metrics_p["sft/nll"], metrics["sft/nll"], rtol=1e-5)
    for g, gp in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_p), strict=True):
        np.testing.assert_allclose(gp, g, rtol=1e-4, atol=1e-6)


def test_blocks_pack_into_their_own_devices_rows():
    """On 4 devices each block of 4 demonstrations goes into the packed rows of the same device."""
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    sharding = NamedSharding(mesh, P("data"))
    num, held, of_device = packing.blocks(sharding, 16)
    assert (num, held) == (4, [0, 1, 2, 3])
    batch = _sft_batch(3, rows=16)
    per_block = packing.rows_needed(batch, num, held)
    assert per_block < 4
    packed = packing.pack(batch, num, held, per_block)
    assert packing.blocks(sharding, 4 * per_block)[2] == of_device
    for k in range(4):
        rows = slice(k * per_block, (k + 1) * per_block)
        ours = sorted(int(x) for x in packed.tokens_BL[rows][packed.mask_BL[rows]])
        theirs = sorted(int(x) for x in batch.tokens_BL[4 * k:4 * k + 4][batch.mask_BL[4 * k:4 * k + 4]])
        assert ours == theirs, k
    # a process holding blocks 1 and 3 only packs those; the others stay empty
    partial = packing.pack(batch, num, [1, 3], per_block)
    assert not partial.mask_BL[:per_block].any() and partial.mask_BL[per_block:2 * per_block].any()


def test_layout_is_the_fewest_token_slots_that_hold_the_probe():
    """Rows of 10 + 54 slots whose sequences are at most 10 + 20 tokens long pack into narrower rows, with a
    row to spare; a batch with a longer sequence does not fit that layout."""
    probe = [_sft_batch(s, W=10, T=54, longest=20) for s in (5, 6)]
    longest = max(len(t) for b in probe for t, _ in packing.sequences(b, range(B)))
    rows, width = packing.choose_layout(probe, 1, [0])
    assert width % 16 == 0 and longest <= width < 64 and rows * width < B * 64
    for w in range(-(-longest // 16) * 16, 64, 16):  # nothing holds the probe (+ a row) in fewer slots
        need = max(packing.rows_needed(b, 1, [0], w) for b in probe)
        assert min(need + 1, B) * w >= rows * width, w
    assert all(packing.pack(b, 1, [0], rows, width) is not None for b in probe)
    longer = _sft_batch(7, W=10, T=54)
    assert max(len(t) for t, _ in packing.sequences(longer, range(B))) > width
    assert packing.pack(longer, 1, [0], rows, width) is None


def test_warm_start_packer_packs_and_runs_a_batch_that_does_not_fit_unpacked(tmp_path, caplog):
    """The warm start's packer (`jaxrl.rl.warm_start._packer`) on the quickstart's data and the 8 fake devices (a block
    of 4 demonstrations each): it packs the probe's
    batches into its layout, and a batch with a longer demonstration than the layout's width comes back as
    it was (the step then runs it unpacked)."""
    import dataclasses
    import logging

    from jaxrl.rl import setup as rl_setup, warm_start as rl_warm_start
    from jaxrl.config import load_config
    from jaxrl.data.pipeline import Encoder, make_splits

    cfg = load_config("configs/quickstart.yaml", ["model.preset=tiny"])
    run, _, _ = rl_setup.setup(cfg, tmp_path)
    d = cfg.data
    encoder = Encoder(run.tokenizer, d.system_prompt, d.target_format, tuple(d.target_formats))
    records, _ = make_splits(d.source, train_size=d.train_size, eval_size=d.eval_size, seed=d.seed,
                             params=d.params, prompt_field=d.prompt_field, answer_field=d.answer_field,
                             encoder=encoder, prompt_limit=None)
    build = rl_warm_start._demonstration_batches(run, records, encoder, 32)
    rng = np.random.default_rng(0)
    head = [build(k, rng.choice(len(records), size=32, replace=False)) for k in range(8)]
    caplog.set_level(logging.INFO, logger="jaxrl.rl")
    pack = rl_warm_start._packer(run, head, 32)
    assert pack is not None and "packed into" in caplog.text
    packed = pack(head[0], 0)
    assert packed.segment_BL is not None and packed.tokens_BL.size < head[0].tokens_BL.size
    assert int(np.sum(packed.completion_mask_BT)) == int(np.sum(head[0].completion_mask_BT))
    width = packed.tokens_BL.shape[1]
    long = head[1]
    mask = np.asarray(long.mask_BL).copy()
    mask[0, :] = True  # row 0 now holds a full-width sequence, longer than the packed rows
    long = dataclasses.replace(long, mask_BL=mask)
    assert mask.shape[1] > width
    assert pack(long, 5) is long and "step 6 does not fit" in caplog.text
