"""The dense [B, L, S] visibility a `KeyMask` stands for, written out independently of `KeyMask.block`, for
the dense-softmax references of the attention tests."""

import jax.numpy as jnp

from jaxrl.models.attention import KeyMask


def dense_visibility(visible, num_queries: int):
    """[B, L, S] bool: query l (at key slot S − L + l) sees key s iff it is real, s ≤ S − L + l, and (packed
    rows) in the query's segment. A dense array passes through. A `KeyMask` always describes a causal
    forward: every caller of `attend` with one passes `causal=True`."""
    if not isinstance(visible, KeyMask):
        return visible
    slots = visible.key_mask_BS.shape[1]
    causal_LS = jnp.arange(slots)[None, :] <= jnp.arange(slots - num_queries, slots)[:, None]
    dense_BLS = visible.key_mask_BS[:, None, :] & causal_LS[None]
    if visible.query_segment_BL is not None:
        dense_BLS &= visible.query_segment_BL[:, :, None] == visible.key_segment_BS[:, None, :]
    return dense_BLS
