"""Unmerged LoRA forward: projections computing x·W + s·(x·A)·B, for sampling without a merged weight copy.

    y = x W (+ b) + s · (x A) B,   s = α / r   (Hu et al. 2021, arXiv:2106.09685)

`attach(model, adapters, cfg, quantized=None)` returns a new `Transformer` sharing the base arrays in which
each target `Proj` of the stacked blocks is a `LoraProj` holding the same stacked kernel (or, for QLoRA, its
int8 / NF4 codes, dequantised one layer at a time inside the layer loop) plus the stacked A, B. It runs
through `Transformer.forward`, the layer scan, the per-layer decode path and `jaxrl.sampling` unchanged, because the
blocks' parameters are sliced per layer by the existing code. Nothing in `models/layers.py` or
`models/transformer.py` changes.

Against `lora.merge` (merge once per rollout, then a plain model): no second copy of the target kernels and,
with a quantised base, only one layer is ever dequantised at a time; but every projection does two more thin
matmuls ([…, in]·[in, r], [r, out]) per call. Measured with `tests/lora/bench_lora_sampling.py` (CPU, 2 cores
shared with other jobs at load ~24, so ±30%; 8 prompts × 4 samples, 32 new tokens, r = 16, best of 5): tiny
(D32 Y2 V64) merge 0.5-0.6 ms, rollout merged 12.5-18.0 ms, unmerged 15.0-19.8 ms; D256 Y4 F768 V2048 merge
5-8 ms, rollout merged 477-643 ms, unmerged 338-570 ms (unmerged faster in both runs at this shape; not
investigated). The merge itself is < 2 % of a rollout, so on these sizes the choice is about memory: unmerged
keeps no merged copy of the targets.
"""

from __future__ import annotations

from typing import Mapping, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.models import lora, quant
from jaxrl.models.layers import Proj
from jaxrl.models.transformer import Transformer


class QuantCodes(nnx.Variable):
    """Quantised kernel codes or scales: state that is neither trained nor a float parameter."""


class LoraProj(nnx.Module):
    """`Proj` plus a low-rank update: einsum(x, W) (+ bias) + s·(x·A)·B, with W optionally quantised.

    Per-layer shapes (the stacked module adds a leading Y to each): kernel [in…, out…] or codes/scale of
    `quant.QuantizedKernel` without Y; A [in…, r]; B [r, out…] (both None: a quantised non-target projection).
    `x`'s trailing `num_in` axes are the inputs.
    """

    def __init__(self, proj: Proj, a: Optional[jax.Array], b: Optional[jax.Array], *, scale: float,
                 num_in: int, qkernel: Optional[quant.QuantizedKernel] = None):
        self.equation, self.dtype, self.num_in, self.scale = proj.equation, proj.dtype, num_in, scale
        self.bias = proj.bias
        if qkernel is None:
            self.kernel, self.codes, self.qscale, self.qmeta = proj.kernel, None, None, None
        else:
            self.kernel = None
            self.codes, self.qscale = QuantCodes(qkernel.codes), QuantCodes(qkernel.scale)
            # per-layer layout: the stored shape without its leading Y
            self.qmeta = (qkernel.kind, (1,) + tuple(qkernel.shape[1:]), qkernel.num_in, qkernel.dtype,
                          qkernel.block)
        if a is None:  # a quantised projection that is not a LoRA target
            self.lora_a = self.lora_b = None
        else:
            self.lora_a, self.lora_b = nnx.LoRAParam(a), nnx.LoRAParam(b)

    def _weight(self) -> jax.Array:
        if self.kernel is not None:
            return self.kernel[...]
        kind, shape, num_in, dtype, block = self.qmeta
        q = quant.QuantizedKernel(self.codes[...][None], self.qscale[...][None], kind, shape, num_in, dtype,
                                  block)
        return quant.dequantize(q)[0]

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        y = jnp.einsum(self.equation, x, self._weight().astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        if self.lora_a is None:
            return y
        xa = jnp.tensordot(x, self.lora_a[...].astype(self.dtype), axes=self.num_in)
        return y + self.scale * jnp.tensordot(xa, self.lora_b[...].astype(self.dtype), axes=1)


def attach(model: Transformer, adapters: Mapping, cfg: lora.LoraConfig,
           quantized: Optional[Mapping] = None) -> Transformer:
    """A copy of `model` whose target projections apply the adapters unmerged (base arrays are shared).

    Args:
      model: the base `Transformer` (not modified).
      adapters: tree of `lora.init_adapters`.
      cfg: the LoRA config.
      quantized: optional `quant.quantize_params(params, kind)` of this model (QLoRA): all seven projections
        then run from their codes, dequantised one layer at a time; non-targets get no low-rank term.

    Returns:
      the new model; `forward`, `layer_states` and `jaxrl.sampling.generate` work on it as on any Transformer.
    """
    graphdef, state = nnx.split(model)
    new = nnx.merge(graphdef, state)  # same arrays, new module objects
    pairs = {target: (a, b) for target, a, b in lora.adapter_pairs(adapters, cfg)}
    for target, (block_name, num_in, _) in lora.SITES.items():
        if target not in pairs and quantized is None:
            continue
        a, b = pairs.get(target, (None, None))
        qkernel = None if quantized is None else lora.lookup(quantized, lora.kernel_path(target))
        parent = getattr(new.layers, block_name)
        a, b = (None, None) if a is None else (jnp.asarray(a), jnp.asarray(b))
        setattr(parent, target, LoraProj(getattr(parent, target), a, b, scale=cfg.scale, num_in=num_in,
                                         qkernel=qkernel))
    return new
