"""PEFT interop for LoRA adapters: `export_peft` / `import_peft`, for `jaxrl export-hf --peft` / `import-hf --peft`.

PEFT's adapter directory is `adapter_config.json` + `adapter_model.safetensors`, with tensors
`base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_A.weight` `[r, in]` and `.lora_B.weight`
`[out, r]` (torch Linear layout, ΔW = (α/r)·B_peft·A_peft). Ours (`jaxrl.io.lora_io`): A `[in…, r]` = A_peftᵀ
and B `[r, out…]` = B_peftᵀ, with the input / output axes flattened in the order of `jaxrl.models.hf_io`
(heads-major for N·H). Options that change the math (DoRA, rsLoRA, rank patterns, biases, ...) are refused.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Mapping

import numpy as np
from safetensors.numpy import save_file

from jaxrl.errors import CheckpointError, ConfigError
from jaxrl.io._safetensors_dir import read_all
from jaxrl.models import lora
from jaxrl.runtime.run_dir import replace_owned_files

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_PEFT_NAME = re.compile(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight")
# adapter_config.json options that change the math we implement: key -> the only accepted value(s)
_PEFT_FIXED = {"peft_type": ("LORA",), "bias": ("none",), "fan_in_fan_out": (False,), "use_rslora": (False,),
               "use_dora": (False,), "modules_to_save": (None, []), "layers_to_transform": (None,),
               "rank_pattern": ({}, None), "alpha_pattern": ({}, None)}


def owns_peft_export(name: str) -> bool:
    """Whether `export_peft` (`export-hf --peft`) writes a file of this name."""
    return name in (PEFT_CONFIG, PEFT_WEIGHTS)


def peft_tensors(adapters: Mapping, cfg: lora.LoraConfig):
    """Yields (PEFT tensor name, float32 array in torch layout) per layer and target (see module doc)."""
    for target, a, b in lora.adapter_pairs(adapters, cfg):
        block, r = lora.SITES[target][0], cfg.rank
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        for y in range(a.shape[0]):
            prefix = f"{_PEFT_PREFIX}model.layers.{y}.{block}.{target}"
            yield f"{prefix}.lora_A.weight", np.ascontiguousarray(a[y].reshape(-1, r).T)
            yield f"{prefix}.lora_B.weight", np.ascontiguousarray(b[y].reshape(r, -1).T)


def export_peft(adapters: Mapping, cfg: lora.LoraConfig, out: str | os.PathLike, *, base_model: str,
                overwrite: bool = False) -> Path:
    """Write `adapter_config.json` + `adapter_model.safetensors` for `peft.PeftModel.from_pretrained`.

    Args:
      adapters, cfg: the adapters and their config.
      out: output directory (atomic; an existing non-empty one needs `overwrite`, see `save_adapters`).
      base_model: `base_model_name_or_path` recorded for PEFT (the HF base the adapters apply to).
    """
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_model),
        "r": cfg.rank, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout,
        "target_modules": list(cfg.targets), "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "use_dora": False, "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
        "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {},
    }
    tensors = dict(peft_tensors(adapters, cfg))
    with replace_owned_files(out, owns=owns_peft_export, overwrite=overwrite,
                             what="PEFT output directory") as tmp:
        save_file(tensors, str(tmp / PEFT_WEIGHTS), metadata={"format": "pt"})
        (tmp / PEFT_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return Path(out)


def import_peft(peft_dir: str | os.PathLike, params: Mapping) -> tuple[dict, lora.LoraConfig, list[str]]:
    """Read a PEFT LoRA adapter for the base whose parameters are `params`.

    Returns:
      (adapters [Y, …] float32 numpy, LoraConfig, notes): notes name settings that were read but play no part
      here (a `lora_dropout` > 0 is a training-time option; jaxrl's LoRA has none and sets it to 0).
    Raises CheckpointError for a missing file, an option we do not implement (DoRA, rsLoRA, rank patterns,
    biases, extra trained modules, fan_in_fan_out), a tensor outside the seven projections, a missing layer or
    a shape that does not fit the base.
    """
    where = Path(peft_dir) / PEFT_CONFIG
    try:
        config = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read PEFT adapter config {where}: {e}") from e
    for key, allowed in _PEFT_FIXED.items():
        if config.get(key, allowed[0]) not in allowed:
            raise CheckpointError(f"{where}: {key}={config[key]!r} is not supported; jaxrl reads "
                                  f"{key}={allowed[0]!r}")
    notes = []
    if config.get("lora_dropout", 0):
        notes.append(f"lora_dropout={config['lora_dropout']} in {where} is not used "
                     "(jaxrl LoRA has no dropout)")
    file = Path(peft_dir) / PEFT_WEIGHTS
    raw = read_all(file, "PEFT adapter weights")
    per_target: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for name, value in raw.items():
        match = _PEFT_NAME.fullmatch(name.removeprefix(_PEFT_PREFIX))
        if not match or match[3] not in lora.SITES or lora.SITES[match[3]][0] != match[2]:
            raise CheckpointError(f"{file}: tensor {name!r} is not a LoRA A/B of {list(lora.TARGETS)}")
        per_target.setdefault(match[3], {}).setdefault(int(match[1]), {})[match[4]] = value
    targets = tuple(t for t in lora.TARGETS if t in per_target)
    listed = config.get("target_modules")
    if isinstance(listed, list) and set(listed) != set(targets):
        raise CheckpointError(f"{where}: target_modules {listed} but the weights hold LoRA for "
                              f"{list(targets)}")
    try:
        cfg = lora.LoraConfig(rank=int(config["r"]), alpha=float(config["lora_alpha"]), targets=targets)
    except (KeyError, TypeError, ValueError, ConfigError) as e:
        raise CheckpointError(f"{where}: {e}") from e
    adapters: dict = {}
    for target in targets:
        block, num_in, _ = lora.SITES[target]
        kernel = lora.lookup(params, lora.kernel_path(target)).shape
        layers = per_target[target]
        if sorted(layers) != list(range(kernel[0])) or any(set(v) != {"A", "B"} for v in layers.values()):
            raise CheckpointError(f"{file}: {target} needs lora_A and lora_B for layers 0..{kernel[0] - 1}")
        ins, outs = tuple(kernel[1:1 + num_in]), tuple(kernel[1 + num_in:])
        want_a, want_b = (cfg.rank, int(np.prod(ins))), (int(np.prod(outs)), cfg.rank)
        for y, pair in layers.items():
            if pair["A"].shape != want_a or pair["B"].shape != want_b:
                raise CheckpointError(f"{file}: layer {y} {target} lora_A {pair['A'].shape} / lora_B "
                                      f"{pair['B'].shape}; the base needs {want_a} / {want_b}")
        order = range(kernel[0])
        a = np.stack([layers[y]["A"].astype(np.float32).T.reshape(ins + (cfg.rank,)) for y in order])
        b = np.stack([layers[y]["B"].astype(np.float32).T.reshape((cfg.rank,) + outs) for y in order])
        adapters.setdefault("layers", {}).setdefault(block, {})[target] = {"lora_a": a, "lora_b": b}
    return adapters, cfg, notes
