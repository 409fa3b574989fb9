"""The seven projection kernels LoRA adapts and QLoRA quantises: their names, where they sit in the params
tree, and their axes (shared by `jaxrl.models.lora` and `jaxrl.models.quant`)."""

from __future__ import annotations

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# target -> (block submodule, number of leading input axes of the per-layer kernel, kernel logical names)
SITES: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "q_proj": ("self_attn", 1, ("embed", "heads", "head_dim")),
    "k_proj": ("self_attn", 1, ("embed", "kv_heads", "head_dim")),
    "v_proj": ("self_attn", 1, ("embed", "kv_heads", "head_dim")),
    "o_proj": ("self_attn", 2, ("heads", "head_dim", "embed")),
    "gate_proj": ("mlp", 1, ("embed", "mlp")),
    "up_proj": ("mlp", 1, ("embed", "mlp")),
    "down_proj": ("mlp", 1, ("mlp", "embed")),
}


def kernel_path(target: str) -> tuple[str, ...]:
    """Path of a target's kernel in the params tree, e.g. ('layers', 'self_attn', 'q_proj', 'kernel')."""
    return ("layers", SITES[target][0], target, "kernel")
