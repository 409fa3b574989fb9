"""Hugging Face interop: `from_pretrained(dir) -> Transformer` and `save_pretrained(model, dir)`.

* Reading streams tensors one at a time from `model.safetensors` or a sharded `model.safetensors.index.json`
  (`safe_open`), checks every tensor's shape against the config before reading its data, and restores straight
  into an abstract model, so host memory stays near 1x the checkpoint plus one stacked parameter.
* Pre-norm Llama / Qwen2 / Qwen3 models export to the standard transformers architectures. Post-norm and
  SiameseNorm models export as `JaxrlForCausalLM` (model_type `jaxrl_decoder`) with our own modeling files
  (`jaxrl/remote_code/`) copied next to the weights and `auto_map` set, so
  `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` loads them.
* Writing goes to a temporary directory next to the target; its files then replace only files we wrote
  (`jaxrl.runtime.run_dir.replace_owned_files`).
The name/layout table between HF tensors and jaxrl parameters lives in `jaxrl.models.hf_io`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from jaxrl.io._safetensors_dir import TensorReader, parse_size, write_tensors
from jaxrl.errors import CheckpointError
from jaxrl.io.model_params import model_from_params, token_ids
from jaxrl.runtime.progress import Progress, tracked
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.models import hf_io
from jaxrl.runtime.run_dir import owns_hf_export, replace_owned_files

REMOTE_CODE_DIR = Path(__file__).parents[1] / "remote_code"
REMOTE_CODE_FILES = ("configuration_jaxrl.py", "modeling_jaxrl.py")
REMOTE_ARCHITECTURE = "JaxrlForCausalLM"
REMOTE_MODEL_TYPE = "jaxrl_decoder"
_AUTO_MAP = {
    "AutoConfig": "configuration_jaxrl.JaxrlDecoderConfig",
    "AutoModel": "modeling_jaxrl.JaxrlModel",
    "AutoModelForCausalLM": "modeling_jaxrl.JaxrlForCausalLM",
}
_GENERATION_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of an HF directory as a dict; CheckpointError if missing or not JSON."""
    file = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise CheckpointError(f"HF checkpoint directory not found: {path}")
    if not file.is_file():
        raise CheckpointError(f"no config.json in HF checkpoint directory {path}")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file} is not valid JSON: {e}") from e


def config_from_pretrained(path: str | os.PathLike, *, dtype: str = "float32",
                           param_dtype: str | None = None) -> TransformerConfig:
    """TransformerConfig of an HF directory (Llama / Qwen2 / Qwen3 / our JaxrlForCausalLM)."""
    where = Path(path) / "config.json"
    try:
        cfg = hf_io.config_from_hf(read_hf_config(path))
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from e
    try:
        return cfg.replace(dtype=dtype, param_dtype=param_dtype or dtype)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from e


def from_pretrained(path: str | os.PathLike, dtype: str = "float32",
                    param_dtype: str | None = None) -> Transformer:
    """Load a local HF directory (config.json + safetensors) into a jaxrl `Transformer`.

    Args:
      path: directory with config.json and model.safetensors or model.safetensors.index.json + shards.
      dtype: compute dtype ("float32" or "bfloat16").
      param_dtype: parameter dtype; defaults to `dtype`.

    Returns:
      the model; `model(tokens_BL)` gives logits [B, L, V].
    """
    cfg = config_from_pretrained(path, dtype=dtype, param_dtype=param_dtype)
    expected = hf_io.hf_shapes(cfg)
    with TensorReader(path) as reader:
        missing = sorted(set(expected) - reader.names())
        if missing:
            raise CheckpointError(f"tensor {missing[0]!r} is missing from {path} "
                                  f"({len(missing)} missing: {missing[:5]})")

        progress = Progress(f"import {path}", len(expected), "tensors")

        def get_tensor(name: str) -> np.ndarray:
            if name not in expected:
                raise CheckpointError(f"{path}: the model config does not use tensor {name!r}")
            array = reader.get(name, expected_shape=expected[name])
            progress.advance()
            return array

        params = hf_io.hf_to_params(cfg, get_tensor)
        progress.finish()
    return model_from_params(cfg, params, where=str(path))


def hf_config_dict(cfg: TransformerConfig) -> dict[str, Any]:
    """config.json contents for `cfg`: standard architecture for pre-norm, our remote code otherwise."""
    try:
        config = hf_io.config_to_hf(cfg)
    except ValueError as e:
        raise CheckpointError(f"cannot export this model to a transformers config: {e}") from e
    config["dtype"] = cfg.param_dtype
    if cfg.norm != "pre":
        config.update(architectures=[REMOTE_ARCHITECTURE], model_type=REMOTE_MODEL_TYPE, norm=cfg.norm,
                      qk_norm=cfg.qk_norm, auto_map=dict(_AUTO_MAP))
    return config


def save_pretrained(model: Transformer, path: str | os.PathLike, tokenizer=None, *,
                    max_shard_size: int | str = "5GB", overwrite: bool = False) -> Path:
    """Write `model` as an HF directory: config.json, generation_config.json, safetensors, tokenizer.

    Post-norm / SiameseNorm models also get our modeling files (load with `trust_remote_code=True`).
    bos/eos/pad ids in both configs are the tokenizer's when one is given (`model_io.token_ids`), so
    transformers' `generate` stops where `jaxrl sample` stops.
    Written next to `path` first, so nothing changes at `path` if anything fails. An existing non-empty `path`
    needs `overwrite=True`, and then only the files this function writes are replaced; a run or checkpoint
    directory, or any other file in `path`, is refused before anything is written (`OutputDirError`).
    """
    cfg = model.cfg
    limit = parse_size(max_shard_size)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    config = hf_config_dict(cfg)  # first: an inexpressible config fails before anything is written
    if tokenizer is not None:
        ids = token_ids(tokenizer, cfg.eos_token_id)
        config.update({k: list(v) if isinstance(v, tuple) else v for k, v in ids.items()})
    shapes = hf_io.hf_shapes(cfg)
    # Reshape to the HF layout of `hf_shapes` (a no-op when params_to_hf already yields it; guards biases).
    tensors = ((name, value.reshape(shapes[name])) for name, value in hf_io.params_to_hf(cfg, params))
    tensors = tracked(tensors, f"export {path}", unit="tensors", total=len(shapes))
    with replace_owned_files(path, owns=owns_hf_export, overwrite=overwrite,
                             what="HF output directory") as tmp:
        write_tensors(tmp, tensors, limit)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        generation = {k: config[k] for k in _GENERATION_KEYS if config.get(k) is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if cfg.norm != "pre":
            for name in REMOTE_CODE_FILES:
                shutil.copyfile(REMOTE_CODE_DIR / name, tmp / name)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return Path(path)
