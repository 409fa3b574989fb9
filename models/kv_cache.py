"""`KVCache`: fixed-capacity key/value cache, a pytree usable inside `jax.jit` and `lax.while_loop`.

Layout (docs/DESIGN.md): `k`, `v` are `[Y, B, K, S, H]` (layers, rows, kv heads, slots, head dim: each
head's slots are contiguous, the layout the attention dots read without a transpose);
`valid_BS` marks slots that hold a real (non-padding) key; `index` is the next slot to write, shared by all
rows, so a left-padded prompt batch fills slots `[0, L)` together and decoding appends one slot per step.
`index` may instead be `[B]` (one write slot per row, `with_row_index`): the continuous-batching engine
(`jaxrl.sampling.continuous`), whose rows are at different steps of their own completions, writes each row's
key at its own slot (a scatter, in place under jit).
Keys are stored after RoPE, so a slot never needs its position again.

Per-layer form (`unstack()`): `k`, `v` become Y-tuples of `[B, K, S, H]` arrays, one buffer per layer. A
decode loop with the per-layer parameters of `Transformer.layer_states()` writes each layer's new slot in
place and reads no slice of a stacked buffer (on XLA:CPU every such slice is a copy; see
`Transformer.forward`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl.models.config import TransformerConfig


@struct.dataclass
class KVCache:
    """Keys/values of every layer for B rows and S slots."""

    k: jax.Array | tuple[jax.Array, ...]  # [Y, B, K, S, H], or (per-layer form) Y arrays [B, K, S, H]
    v: jax.Array | tuple[jax.Array, ...]
    valid_BS: jax.Array  # [B, S] bool
    index: jax.Array  # int32 scalar, or [B] int32 (one write slot per row)

    @classmethod
    def init(cls, cfg: TransformerConfig, batch: int, capacity: int, dtype=None) -> "KVCache":
        """An empty cache: zeros, no valid slot, index 0. `dtype` (str or dtype) defaults to `cfg.dtype`."""
        if batch <= 0 or capacity <= 0:
            raise ValueError(f"KVCache.init needs batch > 0 and capacity > 0, got {batch} and {capacity}")
        dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, capacity, cfg.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            valid_BS=jnp.zeros((batch, capacity), bool),
            index=jnp.zeros((), jnp.int32),
        )

    @property
    def batch(self) -> int:
        return self.valid_BS.shape[0]

    @property
    def capacity(self) -> int:
        return self.valid_BS.shape[1]

    @property
    def per_layer(self) -> bool:
        """True in the per-layer form (`unstack`)."""
        return isinstance(self.k, tuple)

    @property
    def per_row(self) -> bool:
        """True when every row has its own write slot (`index` is [B])."""
        return self.index.ndim == 1

    def with_row_index(self, index_B: jax.Array) -> "KVCache":
        """The same cache writing row b's next key at slot `index_B[b]` ([B] int32)."""
        return self.replace(index=jnp.broadcast_to(jnp.asarray(index_B, jnp.int32), (self.batch,)))

    def layer(self, i: int) -> tuple[jax.Array, jax.Array]:
        """(k_BKSH, v_BKSH) of layer `i` (a static index)."""
        return self.k[i], self.v[i]

    def unstack(self) -> "KVCache":
        """The per-layer form: `k`, `v` as Y-tuples of `[B, K, S, H]` (a no-op if already per layer)."""
        if self.per_layer:
            return self
        split = lambda a: tuple(a[i] for i in range(a.shape[0]))  # noqa: E731
        return self.replace(k=split(self.k), v=split(self.v))

    def append(self, k_new, v_new, valid_BS: jax.Array, length: int) -> "KVCache":
        """Writes the new keys/values of all layers at slots [index, index + length), in place under jit.

        `k_new`, `v_new`: [Y, B, K, L, H], or a Y-sequence of [B, K, L, H] (required in the per-layer form).
        """
        if self.per_layer:
            write = lambda c, n: write_slots(c, n, self.index, row_axis=0, slot_axis=2)  # noqa: E731
            k = tuple(map(write, self.k, k_new))
            v = tuple(map(write, self.v, v_new))
        else:
            k = write_slots(self.k, _stacked(k_new), self.index, row_axis=1, slot_axis=3)
            v = write_slots(self.v, _stacked(v_new), self.index, row_axis=1, slot_axis=3)
        return KVCache(k=k, v=v, valid_BS=valid_BS, index=self.index + length)

    def repeat(self, num: int) -> "KVCache":
        """Each row repeated `num` times, copies contiguous: row r becomes rows r·num … r·num + num − 1."""
        if num <= 0:
            raise ValueError(f"KVCache.repeat needs num >= 1, got {num}")
        rows = (lambda a: tuple(jnp.repeat(x, num, axis=0) for x in a)) if self.per_layer else (
            lambda a: jnp.repeat(a, num, axis=1))
        return KVCache(
            k=rows(self.k),
            v=rows(self.v),
            valid_BS=jnp.repeat(self.valid_BS, num, axis=0),
            index=self.index,
        )


def write_slots(buffer, new, index, *, row_axis: int, slot_axis: int):
    """`new` written into `buffer` along `slot_axis` from `index`: one slot for all rows (a scalar index, a
    dynamic-update-slice), or row b's from `index[b]` (an [B] index along `row_axis`: a vmapped update, which
    XLA lowers to one scatter)."""
    if jnp.ndim(index) == 0:
        return jax.lax.dynamic_update_slice_in_dim(buffer, new, index, axis=slot_axis)
    axis = slot_axis - (slot_axis > row_axis)
    row_write = lambda c, n, i: jax.lax.dynamic_update_slice_in_dim(c, n, i, axis=axis)  # noqa: E731
    return jax.vmap(row_write, in_axes=(row_axis, row_axis, 0), out_axes=row_axis)(buffer, new, index)


def _stacked(x):
    return jnp.stack(x) if isinstance(x, (list, tuple)) else x
