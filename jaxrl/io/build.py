"""Builders at the edge: config sections -> model config, model, tokenizer.

Called by `jaxrl.rl.setup.setup` (and the CLI commands) with one config section each; everything they return is
a plain object with explicit arguments (a `TransformerConfig`, a `Transformer`, a tokenizer).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from jaxrl.config import ModelConfig, TokenizerConfig
from jaxrl.errors import ConfigError
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.models.hf_io import config_from_hf
from jaxrl.sharding import Constrain, no_constraint

# Presets of `TransformerConfig` selectable by name in `model.preset` (explicit table, no getattr magic).
PRESETS = {
    "tiny": TransformerConfig.tiny,
    "tiny_siamese": lambda: dataclasses.replace(TransformerConfig.tiny(), norm="siamese"),
    "smollm2_135m": TransformerConfig.smollm2_135m,
    "qwen2_5_0_5b": TransformerConfig.qwen2_5_0_5b,
    "qwen2_5_1_5b": TransformerConfig.qwen2_5_1_5b,
    "qwen3_0_6b": TransformerConfig.qwen3_0_6b,
    "qwen3_1_7b": TransformerConfig.qwen3_1_7b,
    "qwen3_8b": TransformerConfig.qwen3_8b,
}


def _apply_overrides(base: TransformerConfig, cfg: ModelConfig, vocab_size: int | None) -> TransformerConfig:
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(cfg.overrides) - fields)
    if unknown:
        raise ConfigError(f"model.overrides: unknown TransformerConfig field(s) {unknown}; "
                          f"known: {sorted(fields)}")
    changes: dict[str, Any] = dict(cfg.overrides)
    if vocab_size is not None and "vocab_size" not in changes:
        changes["vocab_size"] = vocab_size
    if cfg.norm is not None:
        changes["norm"] = cfg.norm
    changes.update(remat=cfg.remat, scan_layers=cfg.scan_layers, dtype=cfg.dtype)
    try:
        return dataclasses.replace(base, **changes)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model.overrides: {e}") from None


def preset_config(cfg: ModelConfig, vocab_size: int | None = None) -> TransformerConfig:
    """The TransformerConfig of a preset with `overrides`, `norm`, `remat`, `scan_layers`, `dtype` applied.

    Tiny presets follow the tokenizer: their vocabulary is resized to `vocab_size` when given.
    """
    if cfg.preset not in PRESETS:
        raise ConfigError(f"model.preset={cfg.preset!r}: allowed values are {', '.join(map(repr, PRESETS))}")
    tiny = cfg.preset.startswith("tiny")
    return _apply_overrides(PRESETS[cfg.preset](), cfg, vocab_size if tiny else None)


def model_config(cfg: ModelConfig) -> TransformerConfig:
    """The TransformerConfig a `model:` section describes, read without loading any weights."""
    if cfg.preset is not None:
        return preset_config(cfg)
    from jaxrl.io import model_io

    if cfg.hf_path is not None:
        file = Path(cfg.hf_path).expanduser() / "config.json"
        try:
            base = config_from_hf(json.loads(file.read_text()))
        except OSError as e:
            raise ConfigError(f"model.hf_path: cannot read {file}: {e.strerror}") from None
    else:
        base = model_io.load_config(model_io.resolve_checkpoint(cfg.checkpoint)[0])
    out = _apply_overrides(base, cfg, None)
    return out.replace(norm=cfg.upcycle) if cfg.upcycle else out  # what build_model returns after upcycling


def attention_kernel(cfg: ModelConfig, backend: str | None = None, devices: int | None = None) -> str:
    """`TransformerConfig.attention` for `model.attention` on `backend` (default: JAX's default backend):
    "auto" is cuDNN flash attention on a GPU in bfloat16, else jaxrl's blocked XLA core ("splash" on a TPU is
    opt-in: it is tested in Pallas' interpret mode on CPU, not yet on a TPU, and runs on one device only: a
    Pallas call is not partitioned by GSPMD, and wrapping it in `shard_map` over the batch and head axes, as
    MaxText does, is not done yet)."""
    backend = jax.default_backend() if backend is None else backend
    needs = {"cudnn": "gpu", "splash": "tpu"}.get(cfg.attention)
    if needs is not None and backend != needs:
        raise ConfigError(f"model.attention: {cfg.attention!r} needs a {needs.upper()}; this process runs JAX on "
                          f"{backend!r} (allowed here: auto, xla)")
    devices = jax.device_count() if devices is None else devices
    if cfg.attention == "splash" and devices > 1:  # a pallas_call is not partitioned by GSPMD
        raise ConfigError(f"model.attention: 'splash' runs on one device until it is wrapped in shard_map; this "
                          f"run has {devices} devices (use auto or xla)")
    if cfg.attention == "auto":
        return "cudnn" if backend == "gpu" and cfg.dtype == "bfloat16" else "xla"
    return cfg.attention


def build_tokenizer(model_cfg: ModelConfig, tok_cfg: TokenizerConfig):
    """The tokenizer: the config's, else the one saved with the HF directory / jaxrl checkpoint, else the
    built-in one."""
    from jaxrl.io import tokenizer as tokenizer_lib
    from jaxrl.io import model_io

    if tok_cfg.kind == "hf":
        return tokenizer_lib.load_tokenizer("hf", tok_cfg.path)
    source = model_cfg.hf_path
    if model_cfg.checkpoint is not None:  # the directory next to the steps (RUN, RUN/checkpoints/<step>, ...)
        source = model_io.resolve_checkpoint(model_cfg.checkpoint)[0]
    if source is not None:
        tok = model_io.load_tokenizer(source)
        if tok is not None:
            return tok
    return tokenizer_lib.load_tokenizer("builtin")


def build_model(cfg: ModelConfig, *, vocab_size: int, seed: int, constrain: Constrain = no_constraint
                ) -> Transformer:
    """A fresh preset model, or the weights of an HF directory / jaxrl checkpoint.

    With `model.upcycle` the loaded pre-norm model becomes that SiameseNorm variant
    (`jaxrl.models.upcycle.siamese_from_prenorm`: the same logits at step 0, up to its double-norm factor).
    """
    from jaxrl.io import hf, model_io
    from jaxrl.models.upcycle import siamese_from_prenorm

    kernel = attention_kernel(cfg)
    if cfg.preset is not None:
        return Transformer(preset_config(cfg, vocab_size).replace(attention=kernel), rngs=nnx.Rngs(seed),
                           constrain=constrain)
    if cfg.hf_path is not None:
        model = hf.from_pretrained(cfg.hf_path, dtype=cfg.dtype)
    else:
        model, _ = model_io.load_model_checkpoint(cfg.checkpoint, dtype=cfg.dtype)
    if cfg.upcycle is not None:
        if model.cfg.norm != "pre":
            source = cfg.hf_path if cfg.hf_path is not None else cfg.checkpoint
            raise ConfigError(f"model.upcycle={cfg.upcycle!r}: the model at {source} has "
                              f"norm={model.cfg.norm!r}; only a pre-norm model can be upcycled "
                              "(drop model.upcycle to train it as is)")
        model = siamese_from_prenorm(model, cfg.upcycle)
    # Execution-only switches (no parameter depends on them) apply to loaded weights as well.
    model.cfg = model.cfg.replace(remat=cfg.remat, scan_layers=cfg.scan_layers, attention=kernel)
    return model
