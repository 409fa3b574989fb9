"""LoRA: low-rank adapters on the attention and MLP projections, as a pure pytree merged into the weights.

    W' = W + s · A B,   s = α / r,   A [in…, r], B [r, out…]   (Hu et al. 2021, arXiv:2106.09685)

`W` is a projection kernel in our layout (`[Y, in…, out…]`, e.g. `q_proj` `[Y, D, N, H]`, `o_proj`
`[Y, N, H, D]`); A carries the kernel's input axes and B its output axes, both stacked over the `Y` layers
like the base, so `A B` contracts the rank axis only (`[Y, in…, r]·[Y, r, out…] → [Y, in…, out…]`).

Usage (the train step differentiates the adapters only; the base is the KL reference, no second copy):

    adapters = init_adapters(params, lora_cfg, key)           # B = 0: step 0 is the base model
    loss(adapters) = L(merge(stop_gradient(params), adapters, lora_cfg))
    sample with merge(params, adapters, lora_cfg) (merged once per rollout) or
    `jaxrl.models.lora_forward.attach(model, adapters, lora_cfg)` (unmerged: x·W + s·(x·A)·B)

Why not qwix (the library Tunix uses): qwix's `LoraProvider` intercepts each `einsum` inside a module and
creates `lora_a`/`lora_b` on that module the first time it runs. Our blocks are built stacked (`nnx.vmap`)
and run as `nnx.merge(graphdef, layer_state)` inside a `jax.lax.scan` (or an unrolled loop over static
slices), so that first call happens on a transient per-layer copy inside a traced body: the created
parameters would not be stacked over `Y` nor written back to the model, short of changing
`models/transformer.py`. A functional adapter tree also gives `merge(stop_gradient(base), adapters)` directly,
needs no model surgery for checkpoints or PEFT export, and adds no dependency.

Dropout: refused (`dropout > 0` is a ConfigError). LoRA dropout applies to the adapter input only,
`x W + s · drop(x) A B`, which cannot be written as one merged weight; training through `merge` would
therefore have to ignore it silently, which we do not do.

Memory (`lora_memory`): adapters, their gradients and AdamW moments are O(r·(in+out)) per target; the base
is held once (optionally quantised, `jaxrl.models.quant`), and the merged weights exist only transiently.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxrl.errors import ConfigError
from jaxrl.models import quant
from jaxrl.models.config import TransformerConfig
from jaxrl.models.projections import SITES, TARGETS, kernel_path  # noqa: F401 -- re-exported

@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """`model.lora`: rank r, scale numerator α (s = α/r), dropout (must be 0, see module doc), targets."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ConfigError(f"model.lora.rank must be a positive int, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha must be a number > 0, got {self.alpha!r}")
        if self.dropout != 0:
            raise ConfigError(
                f"model.lora.dropout={self.dropout!r}: only 0 is supported (adapter-input dropout cannot be "
                "expressed in the merged weight W + (alpha/r)·A·B that training uses); set dropout: 0")
        targets = tuple(self.targets) if isinstance(self.targets, (list, tuple)) else (self.targets,)
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets or len(set(targets)) != len(targets):
            raise ConfigError(f"model.lora.targets={list(targets)!r}: need distinct names among "
                              f"{list(TARGETS)}")
        object.__setattr__(self, "targets", targets)

    @property
    def scale(self) -> float:
        """s = α / r."""
        return float(self.alpha) / self.rank


def adapter_shapes(model_cfg: TransformerConfig, target: str, rank: int) -> tuple[tuple, tuple]:
    """(A shape [Y, in…, r], B shape [Y, r, out…]) of one target, from the model config alone."""
    c = model_cfg
    dims = {"embed": c.hidden_size, "heads": c.num_heads, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "mlp": c.mlp_dim}
    _, num_in, names = SITES[target]
    shape = tuple(dims[n] for n in names)
    return (c.num_layers,) + shape[:num_in] + (rank,), (c.num_layers, rank) + shape[num_in:]


def kernel_shape_and_names(model_cfg: TransformerConfig, target: str) -> tuple[tuple, tuple]:
    """(shape [Y, in…, out…], logical names) of a target's stacked base kernel (`jaxrl plan` shards it)."""
    a, b = adapter_shapes(model_cfg, target, 1)
    return a[:-1] + b[2:], ("layers",) + SITES[target][2]


def adapter_logical_names(target: str) -> tuple[tuple, tuple]:
    """Logical axis names of (A, B): the kernel's input / output names, `layers` first, rank never split."""
    _, num_in, names = SITES[target]
    return ("layers",) + names[:num_in] + (None,), ("layers", None) + names[num_in:]


def lookup(tree: Mapping, path: tuple[str, ...]):
    """The subtree or leaf of a nested dict at `path`; KeyError naming the '/'-joined path if absent."""
    node = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise KeyError(f"params lack {'/'.join(path)}")
        node = node[key]
    return node


def init_adapters(params: Mapping, cfg: LoraConfig, key: jax.Array) -> dict:
    """Fresh adapters for `params`: A ~ U(−1/√fan_in, 1/√fan_in) (PEFT's default), B = 0, float32.

    Args:
      params: nested dict of the model (`nnx.state(model, nnx.Param).to_pure_dict()` layout; arrays, abstract
        `ShapeDtypeStruct`s or quantised kernels all work: only shapes are read).
      cfg: the LoRA config.
      key: PRNG key.

    Returns:
      {"layers": {"self_attn"|"mlp": {target: {"lora_a": [Y, in…, r], "lora_b": [Y, r, out…]}}}} (float32).
    """
    adapters: dict = {}
    for i, target in enumerate(cfg.targets):
        block, num_in, _ = SITES[target]
        shape = tuple(lookup(params, kernel_path(target)).shape)  # [Y, in…, out…]
        y, ins, outs = shape[0], shape[1:1 + num_in], shape[1 + num_in:]
        bound = 1.0 / math.sqrt(math.prod(ins))
        a = jax.random.uniform(jax.random.fold_in(key, i), (y,) + ins + (cfg.rank,), jnp.float32, -bound,
                               bound)
        b = jnp.zeros((y, cfg.rank) + outs, jnp.float32)
        adapters.setdefault("layers", {}).setdefault(block, {})[target] = {"lora_a": a, "lora_b": b}
    return adapters


def delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """s · A B in float32: [Y, in…, r] · [Y, r, out…] → [Y, in…, out…] (contracts the rank axis only)."""
    y, r = a.shape[0], a.shape[-1]
    a_YIR = a.astype(jnp.float32).reshape(y, -1, r)
    b_YRO = b.astype(jnp.float32).reshape(y, r, -1)
    d_YIO = jnp.einsum("YIR,YRO->YIO", a_YIR, b_YRO, precision=jax.lax.Precision.HIGHEST)
    return (scale * d_YIO).reshape(a.shape[:-1] + b.shape[2:])


def adapter_pairs(adapters: Mapping, cfg: LoraConfig):
    """Yields (target, A, B) for every target of `cfg`; KeyError naming a missing adapter."""
    for target in cfg.targets:
        node = lookup(adapters, ("layers", SITES[target][0], target))
        yield target, node["lora_a"], node["lora_b"]


def merge(params: Mapping, adapters: Mapping, cfg: LoraConfig) -> dict:
    """Params with every target kernel replaced by W + s·A B (in W's dtype); quantised kernels dequantised.

    Args:
      params: nested dict (model layout); target and other projection kernels may be
        `jaxrl.models.quant.QuantizedKernel`s (QLoRA), which are dequantised here.
      adapters: tree of `init_adapters`.
      cfg: the LoRA config.

    Returns:
      a new nested dict of plain arrays (the input is not modified); differentiable in `adapters`.
    """
    def copy(node):
        if isinstance(node, Mapping):
            return {k: copy(v) for k, v in node.items()}
        return quant.dequantize(node) if isinstance(node, quant.QuantizedKernel) else node

    out = copy(params)
    for target, a, b in adapter_pairs(adapters, cfg):
        *parents, leaf = kernel_path(target)
        node = lookup(out, tuple(parents))
        w = node[leaf]
        if tuple(a.shape[:-1]) + tuple(b.shape[2:]) != tuple(w.shape):
            raise ValueError(f"adapter {target}: A {tuple(a.shape)} · B {tuple(b.shape)} does not match "
                             f"kernel {tuple(w.shape)}")
        node[leaf] = (w.astype(jnp.float32) + delta(a, b, cfg.scale)).astype(w.dtype)
    return out


def count_params(model_cfg: TransformerConfig, cfg: LoraConfig) -> int:
    """Number of adapter parameters: Σ_targets Y·r·(in + out)."""
    total = 0
    for target in cfg.targets:
        a, b = adapter_shapes(model_cfg, target, cfg.rank)
        total += math.prod(a) + math.prod(b)
    return total


def lora_memory(model_cfg: TransformerConfig, lora_cfg: LoraConfig, *,
                base_bits: Any = None) -> dict[str, int]:
    """Bytes of LoRA/QLoRA training state (one replica; divide sharded entries by the shard count).

    Args:
      model_cfg: the model; the base is counted in `model_cfg.param_dtype` unless quantised.
      lora_cfg: the LoRA config.
      base_bits: None (unquantised), "int8" or "nf4": the seven projection kernels of every layer stored
        quantised (`jaxrl.models.quant`: int8 = 1 byte + a float32 scale per output channel; nf4 = ½ byte +
        a float32 absmax per block of 64); embeddings, norms and the head stay in `param_dtype`.

    Returns:
      {"base", "adapters", "adapter_grads", "adapter_adam" (μ and ν), "merged_transient" (the kernels `merge`
      materialises inside a step, in `param_dtype`: the targets, or all seven projections of a quantised
      base),
      "merged_cotangent" (∂L/∂W′ of the targets, formed in the backward pass before ∂L/∂A, ∂L/∂B),
      "total"}: bytes; all of them live at the peak of a train step, activations excluded.
    """
    from jaxrl.models import hf_io

    width = 2 if model_cfg.param_dtype == "bfloat16" else 4
    base = 0
    for name, shape in hf_io.hf_shapes(model_cfg).items():
        kind = name.split(".")[-2] if name.startswith("model.layers.") and name.endswith(".weight") else None
        if base_bits is not None and kind in TARGETS:
            base += quant.quantized_bytes(shape, base_bits)  # torch layout [out, in]
        else:
            base += math.prod(shape) * width
    adapters = 4 * count_params(model_cfg, lora_cfg)
    def kernels_bytes(targets):
        total = 0
        for target in targets:
            a, b = adapter_shapes(model_cfg, target, 1)
            total += math.prod(a[:-1]) * math.prod(b[2:]) * width
        return total

    # `merge` dequantises every projection of a quantised base, but only the targets of a dense one.
    merged = kernels_bytes(TARGETS if base_bits is not None else lora_cfg.targets)
    out = {"base": base, "adapters": adapters, "adapter_grads": adapters, "adapter_adam": 2 * adapters,
           "merged_transient": merged, "merged_cotangent": kernels_bytes(lora_cfg.targets)}
    out["total"] = sum(out.values())
    return out
