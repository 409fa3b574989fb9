"""The model and tokenizer sections of the experiment config (`model:`, `tokenizer:`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxrl._checks import check as _check, check_choice as _check_choice
from jaxrl.models.config import REMATS
from jaxrl.models.lora import LoraConfig

DTYPES = ("float32", "bfloat16")
NORMS = ("pre", "post", "siamese", "siamese_hybrid")


def _expand_paths(cfg: Any, names: tuple[str, ...]) -> None:
    """`~` in path fields means the home directory (YAML has no shell expansion)."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, str) and value.startswith("~"):
            object.__setattr__(
                cfg, name, os.path.expanduser(value)
            )  # frozen: normalise once, at construction


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Which model to train: a preset of `jaxrl.models.TransformerConfig`, an HF directory, or a jaxrl
    checkpoint.

    `overrides` replaces fields of the preset (e.g. `{num_layers: 2}`); `norm`/`remat`/`scan_layers`/`dtype`
    are applied last. `remat` and `scan_layers` only change how the forward pass runs, so they apply to HF
    directories and checkpoints too.
    """

    preset: str | None = "tiny_siamese"
    hf_path: str | None = None
    checkpoint: str | None = None
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    norm: str | None = None
    remat: str = "none"
    scan_layers: bool = True
    # Attention kernel of the full-sequence forward (training, scoring): "xla", jaxrl's blocked core; "cudnn",
    # cuDNN flash attention (GPU, model.dtype bfloat16); "splash", Pallas splash attention (TPU); "auto",
    # cudnn on a GPU in bfloat16, else xla.
    attention: str = "auto"
    # Upcycle the loaded pre-norm weights into this SiameseNorm variant (same logits at step 0 up to the
    # double-norm factor of `jaxrl.models.upcycle`): "siamese" (post-pre) or "siamese_hybrid" (hybrid-pre).
    upcycle: str | None = None
    # LoRA (`jaxrl.models.lora`): train low-rank adapters only; the base is frozen and is the KL reference.
    # `quantize` (QLoRA, with lora): the frozen base kernels as int8 / nf4 (`jaxrl.models.quant`).
    lora: LoraConfig | None = None
    quantize: str = "none"

    def __post_init__(self):
        _expand_paths(self, ("hf_path", "checkpoint"))
        sources = [n for n in ("preset", "hf_path", "checkpoint") if getattr(self, n) is not None]
        _check(
            len(sources) == 1,
            "model",
            sources,
            "set exactly one of model.preset, model.hf_path, model.checkpoint",
        )
        _check_choice("model.dtype", self.dtype, DTYPES)
        if self.norm is not None:
            _check_choice("model.norm", self.norm, NORMS)
        _check_choice("model.remat", self.remat, REMATS)
        _check_choice("model.attention", self.attention, ("auto", "xla", "cudnn", "splash"))
        _check(self.attention != "cudnn" or self.dtype == "bfloat16", "model.attention", self.attention,
               "cuDNN flash attention has no float32 kernel: set model.dtype: bfloat16, or model.attention: "
               "xla")
        _check_choice("model.quantize", self.quantize, ("none", "int8", "nf4"))
        _check(self.quantize == "none" or self.lora is not None, "model.quantize", self.quantize,
               "quantising the base needs model.lora (QLoRA trains adapters over a frozen quantised base)")
        if self.upcycle is not None:
            _check_choice("model.upcycle", self.upcycle, ("siamese", "siamese_hybrid"))
            _check(self.preset is None, "model.upcycle", self.upcycle,
                   "needs pre-norm weights to start from: set model.hf_path or model.checkpoint, "
                   "not model.preset")


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """`builtin` is the tiny character tokenizer of `jaxrl.io.tokenizer`; `path` an HF tokenizer directory."""

    kind: str = "builtin"
    path: str | None = None

    def __post_init__(self):
        _expand_paths(self, ("path",))
        _check_choice("tokenizer.kind", self.kind, ("builtin", "hf"))
        _check(
            (self.path is not None) == (self.kind == "hf"),
            "tokenizer.path",
            self.path,
            "tokenizer.path is required when tokenizer.kind='hf' and must be unset for 'builtin'",
        )

