"""`KVCache`: fixed-capacity key/value cache, a pytree usable inside `jax.jit` and `lax.while_loop`.

Layout (docs/DESIGN.md): `k`, `v` are `[Y, B, K, S, H]` (layers, rows, kv heads, slots, head dim: each
head's slots are contiguous, the layout the attention dots read without a transpose);
`valid_BS` marks slots that hold a real (non-padding) key; `index` is the next slot to write, shared by all
rows, so a left-padded prompt batch fills slots `[0, L)` together and decoding appends one slot per step.
Keys are stored after RoPE, so a slot never needs its position again.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl.models.config import TransformerConfig


@struct.dataclass
class KVCache:
    """Keys/values of every layer for B rows and S slots."""

    k: jax.Array  # [Y, B, K, S, H]
    v: jax.Array  # [Y, B, K, S, H]
    valid_BS: jax.Array  # [B, S] bool
    index: jax.Array  # int32 scalar

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

    def repeat(self, num: int) -> "KVCache":
        """Each row repeated `num` times, copies contiguous: row r becomes rows r·num … r·num + num − 1."""
        if num <= 0:
            raise ValueError(f"KVCache.repeat needs num >= 1, got {num}")
        return KVCache(
            k=jnp.repeat(self.k, num, axis=1),
            v=jnp.repeat(self.v, num, axis=1),
            valid_BS=jnp.repeat(self.valid_BS, num, axis=0),
            index=self.index,
        )
