"""Packed and unpadded RL updates (`train.packing: auto`, issue 33 items 4 and 7): the update's forward over
packed rows, or over each block's real tokens end to end (`jaxrl.models.unpadded`), gives the padded batch's
loss and gradient; `rl_plan` picks the layout that computes least.

In-process on the tiny model and 4 of the 8 fake CPU devices (a block of rows per device, and per
micro-batch). The CLI with packing, 2 processes x 2 devices against 1 x 4, runs in
tests/sharding/test_multihost_cli.py's gdpo case.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.config import MeshConfig, load_config
from jaxrl.errors import ConfigError
from jaxrl.learner.packed import gather_blocks
from jaxrl.learner.train_step import (LossSpec, TrainBatch, jitted_packed_logprob_pass, loss_and_grad,
                                      sequence_logprobs)
from jaxrl.losses import AggMode
from jaxrl.rl import packing, unpadding
from jaxrl.sharding import RULES, make_mesh

B, W, T = 16, 8, 24


def _rollout_batch(seed: int, *, group: int = 1, long_rows: int = 2, full_prompts: bool = False) -> TrainBatch:
    """Rollout rows [prompt left-padded to W | completion right-padded to T] with long-tailed completion
    lengths (`long_rows` rows of the full T, the rest 1-6 tokens), random old log-probs near the model's and
    per-row advantages; in one row two completion tokens are not trained on (an environment's). `group` > 1:
    rows in groups of `group` with one prompt each (the shared-prompt form); `full_prompts`: every prompt W
    tokens."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((B, W + T), np.int32)
    mask = np.zeros((B, W + T), bool)
    cmask = np.zeros((B, T), bool)
    prompt = None
    for b in range(B):
        if b % group == 0:
            p = W if full_prompts else int(rng.integers(1, W + 1))
            prompt = rng.integers(3, 64, size=p)
        c = T if b in rng.choice(B, long_rows, replace=False) else int(rng.integers(1, 7))
        tokens[b, W - len(prompt):W] = prompt
        tokens[b, W:W + c] = rng.integers(3, 64, size=c)
        mask[b, W - len(prompt):W + c] = True
        cmask[b, :c] = True
    cmask[3, 1:3] = False
    old = (rng.normal(size=(B, T)) * 0.3 - 4.2).astype(np.float32) * cmask
    ref = (rng.normal(size=(B, T)) * 0.3 - 4.2).astype(np.float32) * cmask
    adv = np.repeat(rng.normal(size=(B, 1)), T, axis=1).astype(np.float32) * cmask
    ones = np.ones((B,), np.float32)
    return TrainBatch(tokens, mask, cmask, old, ref, adv, ones * 0.2, ones * 0.28, ones * 0, group=group)


def test_layout_places_every_real_token_once_and_indexes_its_predictor():
    batch = _rollout_batch(1)
    start, count, contiguous = packing.row_spans(batch.mask_BL)
    assert contiguous.all()
    layout = packing.rl_layout(start, count, W, W + T, blocks=4)
    per, r = B // 4, layout.rows_per_block
    assert r < per and r in packing.ladder(per)
    flat_BN = np.asarray(batch.tokens_BL).reshape(4, per * (W + T))  # the block-local source positions
    src = layout.src_RL.reshape(4, r * (W + T))
    real = src >= 0
    assert real.sum() == batch.mask_BL.sum()  # every real token once, nothing else
    for k in range(4):
        assert sorted(src[k][real[k]]) == sorted(np.flatnonzero(np.asarray(batch.mask_BL[k * per:(k + 1) * per])))
    for b, t in zip(*np.nonzero(batch.completion_mask_BT)):
        k, i = divmod(b, per)
        at = layout.index_BT[b, t]
        # the packed slot at `index` holds token W + t - 1 of row b, the next slot token W + t, one segment
        assert src[k][at] == i * (W + T) + W + t - 1 and src[k][at + 1] == i * (W + T) + W + t
        assert layout.segment_RL.reshape(4, -1)[k][at] == layout.segment_RL.reshape(4, -1)[k][at + 1] > 0
        assert flat_BN[k][src[k][at + 1]] == batch.tokens_BL[b, W + t]


def test_layout_refuses_what_saves_nothing_or_cannot_be_predicted():
    full = np.zeros(B, np.int64), np.full(B, W + T)  # every row full: nothing to gain
    assert packing.rl_layout(*full, W, W + T, blocks=2) is None
    start, count, _ = packing.row_spans(_rollout_batch(2).mask_BL)
    start, count = start.copy(), count.copy()
    start[5], count[5] = W, 3  # a row with no prompt token: its first completion token has no predictor
    assert packing.rl_layout(start, count, W, W + T, blocks=2) is None
    assert packing.ladder(8) == [1, 2, 3, 4, 5, 6, 7, 8] and packing.ladder(4) == [1, 2, 3, 4]


def test_gather_blocks_reads_each_rows_own_block():
    x = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(6, 4)  # 2 blocks of 3 packed rows x 4
    index = jnp.array([[0, 11], [5, 1], [0, 7], [2, 3]], jnp.int32)  # 2 rows per block
    np.testing.assert_array_equal(gather_blocks(x, index, 3), [[0, 11], [5, 1], [12, 19], [14, 15]])


SPECS = {
    "ppo_kl_entropy": LossSpec(kl_beta=0.05, entropy_coef=0.01),
    "gspo_seq_mean_grad_accum": LossSpec(objective="gspo", agg=AggMode.SEQ_MEAN_TOKEN_MEAN, grad_accum=2,
                                         objective_kwargs=(("clip_high", 4e-4), ("clip_low", 3e-4))),
}


LAYOUTS = ("rows", "unpadded")  # `train.packing` values of one layout each


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", [*SPECS, "shared_prompt_form"])
def test_packed_loss_and_gradient_equal_the_padded_ones(model_parts, name, layout):
    """On 4 devices (and 2 micro-batches for gspo: 4 blocks either way), the packed or unpadded forward's
    loss, metrics and gradient equal the padded forward's; the shared-prompt form: a batch of groups of 4 that
    the padded update runs with each prompt once (`TrainBatch.group`) packs when that computes less."""
    graphdef, params = model_parts
    spec = SPECS.get(name, LossSpec())
    shared = name == "shared_prompt_form"
    batch = _rollout_batch(3, group=4 if shared else 1, long_rows=1 if shared else 2)
    mesh = make_mesh(MeshConfig(data=4, fsdp=1), jax.devices()[:4])
    # attention weighed heavily: the unpadded layout takes its attention classes (`unpadding.classes_of`)
    packer = packing.packer_for(layout, mesh, RULES["fsdp"], spec.grad_accum, attention_weight=1.0)
    assert packer.blocks == 4
    packed, info = packer(batch)
    assert info["train/packed"] == 1.0 and info["train/packed_rows"] < 1.0 and packed.group == 1
    assert info["train/unpadded"] == float(layout == "unpadded")
    assert (packed.packed.unpadded is not None) == (layout == "unpadded")
    assert layout != "unpadded" or len(packed.packed.unpadded.rows) == 4
    assert packer(batch)[0].packed is packed.packed  # the same arrays again: packed once (`RLPacker._last`)
    fn = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=spec))
    loss, grads, metrics = jax.device_get(fn(params, batch=jax.tree.map(jnp.asarray, batch)))
    loss_p, grads_p, metrics_p = jax.device_get(fn(params, batch=packed))
    assert abs(float(loss)) > 1e-3
    np.testing.assert_allclose(loss_p, loss, rtol=1e-5, atol=1e-7)
    for key in ("pg/loss", "entropy/mean", "kl/loss"):
        if key in metrics:
            np.testing.assert_allclose(metrics_p[key], metrics[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for g, gp in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_p), strict=True):
        np.testing.assert_allclose(gp, g, rtol=1e-4, atol=1e-6)


def test_unpadded_layout_places_every_real_token_once_and_indexes_its_predictor():
    """Each block's real tokens end to end in one row; every real position in exactly one attention class,
    left-aligned in a row of its class (classes by decreasing length, widths from the ladder), `rows` and
    `slots` inverse maps of each other, `predict_RM` / `predictor_RN` too; completion token (b, t) predicted by
    the position of token W + t − 1 (the next position holding token W + t)."""
    batch = _rollout_batch(1, long_rows=6)
    start, count, _ = packing.row_spans(batch.mask_BL)
    u = unpadding.unpadded_layout(start, count, W, W + T, blocks=2, attention_weight=1.0)  # classes pay
    per, length = B // 2, W + T
    assert u.src_RN.shape[0] == 2 and u.src_RN.shape[1] in unpadding.ladder(per * length, unpadding.WIDTH_STEPS)
    assert u.src_RN.shape[1] >= count.reshape(2, per).sum(1).max() and u.src_RN.shape[1] < per * length
    mask = np.asarray(batch.mask_BL)
    size = per // 4
    assert len(u.rows) == len(u.slots) == unpadding.classes_of(per, length, 1.0) == 4
    assert unpadding.classes_of(per, length, 1e-3) == 1  # attention 2% of the work: one class
    assert sum((x >= 0).sum() for x in u.slots) == (u.src_RN >= 0).sum() == mask.sum()
    lengths = []
    for rows, slots in zip(u.rows, u.slots):
        assert rows.shape[1] in unpadding.ladder(length, unpadding.WIDTH_STEPS)
        real = rows >= 0
        assert np.array_equal(real, np.arange(rows.shape[1])[None, :] < real.sum(1, keepdims=True))  # left-aligned
        for a, l in zip(*np.nonzero(real)):
            assert slots[a // size, rows[a, l]] == (a % size) * rows.shape[1] + l
        lengths.append(real.sum(1).reshape(2, size))
    lengths = np.concatenate(lengths, axis=1)  # [block, rank]
    assert np.all(np.diff(lengths, axis=1) <= 0) and np.array_equal(np.sort(lengths.ravel()), np.sort(count))
    for k in range(2):
        real = u.src_RN[k] >= 0
        assert np.all(np.flatnonzero(real) == np.arange(real.sum()))  # end to end, padding last
        used = u.predict_RM[k] >= 0
        np.testing.assert_array_equal(u.predictor_RN[k][u.predict_RM[k][used]], np.flatnonzero(used))
        assert (u.predictor_RN[k] >= 0).sum() == used.sum()
    flat = np.asarray(batch.tokens_BL).reshape(2, per * length)
    for b, t in zip(*np.nonzero(mask[:, W:])):
        k = b // per
        at = u.predict_RM[k][u.index_BT[b, t]]
        assert u.src_RN[k][at] == (b % per) * length + W + t - 1 and u.segment_RN[k][at] == u.segment_RN[k][at + 1]
        assert flat[k][u.src_RN[k][at + 1]] == batch.tokens_BL[b, W + t]


def test_plan_weighs_positions_and_attention_pairs():
    """`rl_plan` takes the layout of least positions + weighted causal pairs: one full row and seven of 4
    tokens per block pack into 2 rows of 32 (64 positions, 2 x 528 pairs) where the unpadded layout has as many
    positions and more pairs (its longest class pairs the full row with a short one: 2 x 528, + 6 x 10), so a
    heavy attention weight packs; rows all longer than half the width (no two share a packed row) run unpadded
    with the tiny model's weight; rows with no padding run padded."""
    from jaxrl.models import TransformerConfig

    weight = unpadding.attention_weight_of(TransformerConfig.tiny())
    assert 0 < weight < 0.1
    tailed = np.zeros((B, W + T), bool)
    tailed[:, W - 2:W + 2] = True
    tailed[::8] = True
    plan = packing.rl_plan(tailed, W, 1, blocks=2, attention_weight=1.0)
    assert isinstance(plan, packing.RLLayout) and plan.rows_per_block == 2
    u = unpadding.unpadded_layout(*packing.row_spans(tailed)[:2], W, W + T, blocks=2, attention_weight=1.0)
    assert u.src_RN.shape == (2, 64) and u.attention_pairs() == 2 * (2 * 528 + 6 * 10)
    uniform = np.zeros((B, W + T), bool)
    for b in range(B):
        uniform[b, W - 3 - b % 5:W + T - b % 4] = True  # 20-32 real tokens of 32: longer than half each
    assert packing.rl_layout(*packing.row_spans(uniform)[:2], W, W + T, blocks=2) is None
    assert isinstance(packing.rl_plan(uniform, W, 1, blocks=2, attention_weight=weight), unpadding.UnpaddedLayout)
    assert packing.rl_plan(np.ones((B, W + T), bool), W, 1, blocks=2, attention_weight=weight) is None
    assert unpadding.work(10, 2, 4, 0.5) == 10 + 0.5 * 2 * 10


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_logprob_pass_equals_the_padded_one(model_parts, layout):
    """The old / reference log-prob pass over packed or unpadded rows (`jitted_packed_logprob_pass`, what
    `assemble` runs under `train.packing: auto`) gives the padded pass's log-probs at every completion token."""
    graphdef, params = model_parts
    batch = _rollout_batch(5)
    mesh = make_mesh(MeshConfig(data=4, fsdp=1), jax.devices()[:4])
    packed, info = packing.packer_for(layout, mesh, RULES["fsdp"], 1)(batch)
    assert info["train/packed"] == 1.0 and info["train/unpadded"] == float(layout == "unpadded")
    spec = LossSpec(temperature=0.7)
    got = np.asarray(jitted_packed_logprob_pass(graphdef, spec)(params, packed.packed))
    want = np.asarray(jax.jit(functools.partial(sequence_logprobs, graphdef=graphdef, width=T, chunk=8192,
                                                temperature=0.7))(params, tokens_BL=batch.tokens_BL,
                                                                  mask_BL=batch.mask_BL))
    m = np.asarray(batch.mask_BL[:, W:])
    assert got.shape == want.shape == (B, T) and np.all(want[m] < 0)
    np.testing.assert_allclose(got[m], want[m], rtol=1e-5, atol=1e-5)


def test_packer_leaves_a_batch_that_packing_would_not_shrink():
    """Rows that fill their width run as they are (so do groups whose shared prompts compute fewer positions
    than the packed rows would)."""
    batch = _rollout_batch(4, long_rows=B, full_prompts=True)
    mesh = make_mesh(MeshConfig(data=4, fsdp=1), jax.devices()[:4])
    packer = packing.packer_for("auto", mesh, RULES["fsdp"], 1)
    same, info = packer(batch)
    assert same is batch and info == {"train/packed": 0.0, "train/unpadded": 0.0, "train/packed_rows": 1.0}
    assert packing.packer_for("off", mesh, RULES["fsdp"], 1) is None
    # the forward the packed rows are weighed against: B·L positions, or P·W + B·T with shared prompts
    assert packing.padded_work(B, W, W + T, 1) == B * (W + T)
    assert packing.padded_work(B, W, W + T, 4) == B // 4 * W + B * T


def test_bad_packing_value_is_one_line():
    with pytest.raises(ConfigError, match="train.packing='always': allowed values are 'auto', 'rows', 'unpadded', 'off'"):
        load_config(None, ["train.packing=always"])
    assert load_config(None, []).train.packing == "off"
