"""Weight-only quantisation of the projection kernels for QLoRA: int8 per output channel and NF4 blockwise.

int8 (absmax, per output channel c over the kernel's input axes):
    s_c = max_i |W_ic| / 127,   q_ic = round(W_ic / s_c) ∈ [−127, 127],   Ŵ_ic = q_ic · s_c,
so |Ŵ − W| ≤ s_c / 2 elementwise.
NF4 (Dettmers et al. 2023, QLoRA, arXiv:2305.14314): per block of `block` consecutive input entries of one
output channel, m = max |W| over the block, code = the nearest of the 16 NormalFloat levels ℓ_k to W / m,
Ŵ = ℓ_code · m. The levels are the normal quantiles of the paper's construction (8 positive from
Φ⁻¹(linspace(δ, ½, 9)), 7 negative from Φ⁻¹(linspace(δ, ½, 8)), and 0, δ = 0.9677083, scaled to [−1, 1]),
computed here with `statistics.NormalDist`; two codes are packed per byte. The paper's double quantisation of
the block absmax values is not done (they stay float32: 0.5 extra bits per weight at block 64).

Only the seven projection kernels of the layers are quantised (embeddings, norms, biases and the LM head stay
in full precision, as in the QLoRA paper's setup); `jaxrl.models.lora.merge` dequantises them, so the train
step and the sampler see ordinary dense weights built on the fly from the stored codes.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.models.projections import SITES, kernel_path

from jaxrl.errors import ConfigError

KINDS = ("int8", "nf4")
NF4_BLOCK = 64
_NF4_OFFSET = 0.9677083


def nf4_levels() -> np.ndarray:
    """The 16 NormalFloat-4 levels in [−1, 1], ascending (float32)."""
    inv = NormalDist().inv_cdf
    pos = [inv(p) for p in np.linspace(_NF4_OFFSET, 0.5, 9)[:-1]]
    neg = [-inv(p) for p in np.linspace(_NF4_OFFSET, 0.5, 8)[:-1]]
    levels = np.sort(np.asarray(pos + neg + [0.0], np.float64))
    return (levels / np.abs(levels).max()).astype(np.float32)


@struct.dataclass
class QuantizedKernel:
    """A quantised kernel `[Y, in…, out…]`: codes and scales are pytree leaves, the layout is static.

    int8: codes int8 [Y, I, O], scale float32 [Y, O]. nf4: codes uint8 [Y, O, I/2] (two per byte, low nibble
    first), scale float32 [Y, O, I/block]. I, O: the flattened input / output axes.
    """

    codes: jax.Array
    scale: jax.Array
    kind: str = struct.field(pytree_node=False)
    shape: tuple = struct.field(pytree_node=False)
    num_in: int = struct.field(pytree_node=False)
    dtype: str = struct.field(pytree_node=False)
    block: int = struct.field(pytree_node=False, default=NF4_BLOCK)


def nearest_level(x: jax.Array, levels: np.ndarray) -> jax.Array:
    """argmin_k |x − ℓ_k| for ascending `levels`, ties to the lower level, without an [..., K] temporary.

    The nearest level is the number of midpoints (ℓ_k + ℓ_{k+1}) / 2 strictly below x, found by binary search;
    broadcasting |x − ℓ| over the 16 NF4 levels held a float32 tensor 16x the kernel (+3.1 GiB when
    quantising SmolLM2-135M, benchmarks/RESULTS.md).
    """
    levels = np.asarray(levels, np.float32)
    mids = jnp.asarray((levels[1:] + levels[:-1]) / 2, jnp.float32)
    return jnp.searchsorted(mids, x, side="left").astype(jnp.int32)


def _split(shape, num_in):
    return shape[0], math.prod(shape[1:1 + num_in]), math.prod(shape[1 + num_in:])


def quantize(w: jax.Array, num_in: int, kind: str, *, block: int = NF4_BLOCK) -> QuantizedKernel:
    """Quantise one stacked kernel `w` [Y, in…, out…] whose first `num_in` axes after Y are inputs."""
    if kind not in KINDS:
        raise ConfigError(f"quantisation kind {kind!r}; allowed: {list(KINDS)}")
    y, i, o = _split(w.shape, num_in)
    w_YIO = jnp.asarray(w, jnp.float32).reshape(y, i, o)
    if kind == "int8":
        absmax_YO = jnp.max(jnp.abs(w_YIO), axis=1)
        scale_YO = jnp.where(absmax_YO > 0, absmax_YO / 127.0, 1.0)
        codes = jnp.clip(jnp.round(w_YIO / scale_YO[:, None, :]), -127, 127).astype(jnp.int8)
        return QuantizedKernel(codes, scale_YO, kind, tuple(w.shape), num_in, str(w.dtype), block)
    if i % block or block % 2:
        raise ConfigError(f"nf4 quantisation of a kernel {tuple(w.shape)}: input size {i} is not a multiple "
                          f"of the block size {block} (an even number that divides it is needed)")
    packed, safe_YOG = _nf4_codes(w_YIO, block)
    return QuantizedKernel(packed, safe_YOG, kind, tuple(w.shape), num_in, str(w.dtype), block)


@functools.partial(jax.jit, static_argnums=1)
def _nf4_codes(w_YIO: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """(packed codes uint8 [Y, O, I/2], block absmax float32 [Y, O, I/block]), one layer at a time, so the
    temporaries are one layer's size, not the stacked kernel's."""
    _, i, o = w_YIO.shape

    def layer(w_IO):
        w_OGb = w_IO.T.reshape(o, i // block, block)
        absmax_OG = jnp.max(jnp.abs(w_OGb), axis=-1)
        safe_OG = jnp.where(absmax_OG > 0, absmax_OG, 1.0)
        idx_OI = nearest_level(w_OGb / safe_OG[..., None], nf4_levels()).reshape(o, i).astype(jnp.uint8)
        return idx_OI[:, 0::2] | (idx_OI[:, 1::2] << 4), safe_OG

    return jax.lax.map(layer, w_YIO)


def dequantize(q: QuantizedKernel, dtype=None) -> jax.Array:
    """Ŵ in the kernel's layout and `dtype` (default: the dtype it was quantised from)."""
    y, i, o = _split(q.shape, q.num_in)
    dtype = jnp.dtype(dtype or q.dtype)
    if q.kind == "int8":
        w_YIO = q.codes.astype(jnp.float32) * q.scale[:, None, :]
    else:
        lo, hi = q.codes & 0xF, q.codes >> 4
        idx_YOI = jnp.stack([lo, hi], axis=-1).reshape(y, o, i)
        w_YOGb = jnp.asarray(nf4_levels())[idx_YOI.astype(jnp.int32)].reshape(y, o, i // q.block, q.block)
        w_YIO = (w_YOGb * q.scale[..., None]).reshape(y, o, i).transpose(0, 2, 1)
    return w_YIO.reshape(q.shape).astype(dtype)


def quantize_params(params: Mapping, kind: str, *, block: int = NF4_BLOCK) -> dict:
    """A copy of `params` with the seven projection kernels of `layers` as `QuantizedKernel`s."""

    out = jax.tree.map(lambda x: x, dict(params), is_leaf=lambda x: not isinstance(x, Mapping))
    for target, (_, num_in, _) in SITES.items():
        *parents, leaf = kernel_path(target)
        node = out
        for key in parents:
            node = node[key]
        node[leaf] = quantize(node[leaf], num_in, kind, block=block)
    return out


def quantized_bytes(hf_shape: tuple[int, ...], kind: str, *, block: int = NF4_BLOCK) -> int:
    """Stored bytes of one quantised [out, in] weight (torch layout): codes plus float32 scales."""
    out_dim, in_dim = hf_shape
    if kind == "int8":
        return out_dim * in_dim + 4 * out_dim
    if kind == "nf4":
        return out_dim * in_dim // 2 + 4 * out_dim * math.ceil(in_dim / block)
    raise ConfigError(f"quantisation kind {kind!r}; allowed: {list(KINDS)}")
