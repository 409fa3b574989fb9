"""The RL update's forward over packed rows: the loss reads the padded batch's [B, T] tensors, unchanged.

A rollout batch holds B rows [prompt left-padded to W | completion right-padded to T]; with long-tailed
completion lengths most of the B·L positions (L = W + T) are padding. Packing (`jaxrl.rl.packing.rl_layout`)
lays each row's real tokens end to end into R < B rows of width L (segment ids: no attention across
segments, positions restarting per segment), in blocks of rows that never straddle a device shard or a
micro-batch. The forward and the vocabulary projection run over those R·L positions only; each completion
token's log-prob and entropy are then gathered back to its [B, T] place,

    logp[b, t] = logp_packed[k(b), index[b, t]],   k(b) the block of row b,

so every per-token and per-row quantity of the loss (advantages, old / reference log-probs, clip bounds,
aggregation over rows and tokens) keeps its padded layout: the loss and gradient are the padded batch's up
to float summation order (tests/train/test_packed_update.py). Tokens off the completion mask gather an
arbitrary finite log-prob that the mask removes, as in the padded batch.

The unpadded layout (`UnpaddedRows`, `jaxrl.rl.unpadding`) is the same with one row per block holding all its
rows' real tokens, attention run on rows of each sequence (`jaxrl.models.unpadded`), and the vocabulary projection
only at the M positions that predict a completion token: there `index[b, t]` indexes those M.

Padded and packed batches are the same `TrainBatch` (`packed` None or not); the loss picks the forward.
(Tunix and MaxText pack SFT data; verl packs RL rows with FlashAttention's varlen kernels on GPU and
unpads the loss inputs; here the loss inputs stay padded, which costs B·T floats per tensor and keeps one
loss for every layout.)
"""

from __future__ import annotations

from typing import Optional

import chex
import flax.struct
import jax
import jax.numpy as jnp

from jaxrl import losses
from jaxrl.models import unpadded


@flax.struct.dataclass
class PackedRows:
    """The forward's input of a packed batch, and where each completion token's log-prob lands.

    R = blocks x `rows_per_block` rows of width L; block k holds the tokens of the padded rows
    [k·B/blocks, (k+1)·B/blocks).
    """

    tokens_RL: jax.Array  # int32 [R, L], packed real tokens (0 at padding)
    mask_RL: jax.Array  # bool [R, L], real tokens
    segment_RL: jax.Array  # int32 [R, L], 1, 2, ... per sequence within a row; 0 at padding
    # int32 [B, T]: flat position, within its block's rows_per_block·L positions, of the hidden state that
    # predicts completion token (b, t) (the packed position of token W + t − 1); 0 off the real tokens
    index_BT: jax.Array
    rows_per_block: int = flax.struct.field(pytree_node=False, default=1)
    unpadded: Optional["UnpaddedRows"] = None  # the unpadded layout's maps (one row per block), else None


@flax.struct.dataclass
class UnpaddedRows:
    """The maps of an unpadded batch (`jaxrl.rl.unpadding.unpadded_layout`; block-local, −1 at padding):
    with them `PackedRows.index_BT` indexes the M `predict_RM` positions of its block instead of its row."""

    rows: tuple  # per attention class c, int32 [A_c, L_c]: each class slot's position (`models.unpadded`)
    slots: tuple  # per attention class c, int32 [R, N]: each position's class slot
    predict_RM: jax.Array  # int32 [R, M]: the positions whose hidden states predict a completion token
    predictor_RL: jax.Array  # int32 [R, N]: the inverse of predict (each position's m)


def packed_token_logprobs(model, packed: PackedRows, *, chunk: int, temperature: float = 1.0):
    """(logp_BT, entropy_BT) of the completion tokens of a packed batch, as the padded forward gives them.

    The model runs over the packed rows (`Transformer.forward(segment_BL=...)`); position l of a packed row
    predicts its token l + 1 (the last position predicts nothing, log-prob 0); `gather_blocks` moves each
    completion token's values to [B, T].
    """
    chex.assert_rank([packed.tokens_RL, packed.index_BT], 2)
    chex.assert_equal_shape([packed.tokens_RL, packed.mask_RL, packed.segment_RL])
    if packed.unpadded is not None:
        return _unpadded_token_logprobs(model, packed, chunk=chunk, temperature=temperature)
    out = model.forward(packed.tokens_RL, None, packed.mask_RL, return_hidden=True, return_logits=False,
                        segment_BL=packed.segment_RL)
    logp_RT, ent_RT = losses.token_logprobs_and_entropy(out.hidden[:, :-1], model.unembedding(),
                                                        packed.tokens_RL[:, 1:], chunk_size=chunk,
                                                        temperature=temperature)
    pad = lambda x_RT: jnp.pad(x_RT, ((0, 0), (0, 1)))
    gather = lambda x_RL: gather_blocks(x_RL, packed.index_BT, packed.rows_per_block)
    return gather(pad(logp_RT)), gather(pad(ent_RT))


def _unpadded_token_logprobs(model, packed: PackedRows, *, chunk: int, temperature: float):
    """`packed_token_logprobs` of unpadded rows (`jaxrl.models.unpadded`): the vocabulary projection runs
    only at the M positions that predict a completion token (`predict_RM`)."""
    u = packed.unpadded
    out = model.forward(packed.tokens_RL, None, packed.mask_RL, return_hidden=True, return_logits=False,
                        segment_BL=packed.segment_RL, row_map=(u.rows, u.slots))
    hidden_RMD = unpadded.permute(out.hidden, u.predict_RM, u.predictor_RL)
    targets_RM = jnp.take_along_axis(packed.tokens_RL, jnp.maximum(u.predict_RM, 0) + 1, axis=1)
    logp_RM, ent_RM = losses.token_logprobs_and_entropy(hidden_RMD, model.unembedding(), targets_RM,
                                                        chunk_size=chunk, temperature=temperature)
    return gather_blocks(logp_RM, packed.index_BT, 1), gather_blocks(ent_RM, packed.index_BT, 1)


def gather_blocks(x_RL: jax.Array, index_BT: jax.Array, rows_per_block: int) -> jax.Array:
    """y[b, t] = x_flat_k[index[b, t]], x_flat_k the rows_per_block·L values of row b's block k, flattened.

    A gather batched over the blocks (leading dimension), so rows sharded over devices by blocks gather on
    their own device."""
    rows, length = x_RL.shape
    b, t = index_BT.shape
    if rows % rows_per_block:
        raise ValueError(f"{rows} packed rows do not split into blocks of {rows_per_block}")
    blocks = rows // rows_per_block
    if b % blocks:
        raise ValueError(f"{b} rows do not split into the {blocks} blocks of the packed rows")
    x_KN = x_RL.reshape(blocks, rows_per_block * length)
    index_KM = index_BT.reshape(blocks, (b // blocks) * t)
    return jnp.take_along_axis(x_KN, index_KM, axis=1).reshape(b, t)
