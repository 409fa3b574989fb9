"""Shardings of LoRA adapters and of QLoRA's quantised kernels, from the same rule tables as the base.

Adapter A `[Y, in…, r]` takes the logical names of its kernel's input axes and B `[Y, r, out…]` those of the
output axes (`jaxrl.models.lora.adapter_logical_names`); the rank axis is never split. So under `FSDP` the
`embed` side of every adapter is split over `fsdp` like its kernel, and under `FSDP_TP` `heads` / `kv_heads` /
`mlp` go over `tensor`: A·B then lands in the kernel's own layout and `W + s·A·B` needs no resharding of W.

Quantised kernels (`jaxrl.models.quant.QuantizedKernel`) flatten their input / output axes (`[Y, I, O]`); the
flattened axis takes the name of its first (outermost) axis, e.g. q_proj's O = N·H is `heads`, which splits
whole heads since the flattening is heads-major. Block scales of NF4 stay whole along their block axis.
The existing rule tables are unchanged.
"""

from __future__ import annotations

from typing import Any, Mapping

from jax.sharding import Mesh

from jaxrl.sharding.place import named_sharding
from jaxrl.sharding.rules import Rules


def adapter_shardings(adapters: Mapping, mesh: Mesh, rules: Rules) -> dict:
    """NamedShardings of an adapter tree (`jaxrl.models.lora.init_adapters` layout), checked for divisibility.

    Also serves the optimizer moments of the adapters (same tree) and `jax.jit` in/out shardings.
    """
    from jaxrl.models import lora  # local: jaxrl.models imports jaxrl.sharding

    out: dict = {}
    for block, targets in adapters["layers"].items():
        for target, leaves in targets.items():
            names = dict(zip(("lora_a", "lora_b"), lora.adapter_logical_names(target)))
            out.setdefault("layers", {}).setdefault(block, {})[target] = {
                leaf: named_sharding(tuple(value.shape), names[leaf], mesh, rules,
                                     what=f"layers.{block}.{target}.{leaf}")
                for leaf, value in leaves.items()
            }
    return out


def quantized_names(target: str, kind: str) -> dict[str, tuple]:
    """Logical names of a quantised target kernel's `codes` and `scale` (see the module docstring)."""
    from jaxrl.models import lora

    _, num_in, names = lora.SITES[target]
    i, o = names[0], names[num_in]
    if kind == "int8":
        return {"codes": ("layers", i, o), "scale": ("layers", o)}
    return {"codes": ("layers", o, i), "scale": ("layers", o, None)}


def quantized_kernel_shardings(qkernel: Any, target: str, mesh: Mesh, rules: Rules) -> Any:
    """The `QuantizedKernel` with its codes and scale replaced by their NamedShardings (for `device_put`)."""
    names = quantized_names(target, qkernel.kind)
    out = {}
    for field in ("codes", "scale"):
        shape = tuple(getattr(qkernel, field).shape)
        out[field] = named_sharding(shape, names[field], mesh, rules, what=f"{target}.{field}")
    return qkernel.replace(**out)
