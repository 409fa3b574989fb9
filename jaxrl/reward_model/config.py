"""`RMExperimentConfig`: typed frozen config of `jaxrl train-rm`, loaded like `jaxrl.config` (YAML + `--set`).

The model, tokenizer, optimiser, checkpoint and logging sections are the same dataclasses as `jaxrl train`'s
(`jaxrl.config`); `data`, `debias` and `train` are specific to reward-model training. The YAML <-> dataclass
machinery (unknown keys with close matches, dotted overrides, type checks) is `jaxrl.config.io`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


from jaxrl.config.io import dump_yaml_config, load_yaml_config
from jaxrl.config import CheckpointConfig, LoggingConfig, ModelConfig, OptimizerConfig, TokenizerConfig
from jaxrl.errors import ConfigError

ATTRIBUTES = ("length", "sycophancy", "format")
REPRESENTATIONS = ("difference", "concat")
DEFAULT_RM_CONFIG = "rm_length_bt.yaml"


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {allowed}")


@dataclasses.dataclass(frozen=True)
class RMDataConfig:
    """Preference pairs: `synthetic` (built-in arithmetic task with a planted length bias) or a
    .jsonl/.parquet file.

    `chosen_longer_rate`: fraction of synthetic *training* pairs whose chosen answer is the verbose one (the
    planted bias); the synthetic eval set is always balanced (0.5). `eval_source`: a file for evaluation
    (for a file `source`, `eval_size` pairs are otherwise held out of it). Sequences longer than `max_len`
    tokens are dropped (counted in the log).
    """

    source: str = "synthetic"
    eval_source: str | None = None
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    train_size: int = 4096
    eval_size: int = 512
    batch_size: int = 32
    max_len: int = 64
    chosen_longer_rate: float = 0.8
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        for name in ("train_size", "eval_size", "batch_size", "max_len"):
            _check(getattr(self, name) >= 1, f"data.{name}", getattr(self, name), "must be >= 1")
        _check(0.0 <= self.chosen_longer_rate <= 1.0, "data.chosen_longer_rate", self.chosen_longer_rate,
               "must be in [0, 1]")
        if self.source != "synthetic":
            _check(self.source.endswith((".jsonl", ".parquet")), "data.source", self.source,
                   "allowed: 'synthetic' or a path ending in .jsonl / .parquet")


@dataclasses.dataclass(frozen=True)
class DebiasConfig:
    """DIR (arXiv:2512.23461): RM loss L_BT + gamma * CLUB(x; a), x = h_chosen - h_rejected.

    The classifier q(a|x) (MLP with `hidden_dim` units, or linear when null) is trained `inner_steps` AdamW
    steps (`classifier_lr`, `classifier_weight_decay`) per micro-step on detached x, with its own optimiser
    state. Each RM batch is split into `micro_batches` equal micro-batches, processed in order: `inner_steps`
    classifier steps on micro-batch m, then its CLUB estimate with that classifier; the RM minimises
    L_BT + gamma * mean_m CLUB_m (one RM update per batch).

    Reference (Qwen-Applications/DIR, `reward_models/debias_trainer_length.py`, `scripts/train_debias_rm.sh`):
    * `gamma` is the effective weight of the CLUB term in a global-batch objective, i.e. the reference's
      `debias_factor / W` with W data-parallel GPUs (`jaxrl.losses.dir.reference_gamma`); the script's
      debias_factor=1 on W=8 GPUs gives the default 0.125.
    * 5 classifier steps per micro-step, 16 gradient-accumulation micro-steps of N = 8 gathered pairs per RM
      step (80 classifier steps per RM step): `data.batch_size=128, debias.micro_batches=16`. The default
      micro_batches=1 runs the 5 steps once on the whole batch (a larger N per CLUB estimate).
    * torch AdamW(lr=1e-4) with its default weight decay 0.01 (`classifier_weight_decay`); hidden 1024. The
      defaults `classifier_lr=1e-3`, `hidden_dim=64` are sized for the tiny demo models.
    """

    enabled: bool = False
    attribute: str = "length"
    gamma: float = 0.125
    inner_steps: int = 5
    micro_batches: int = 1
    classifier_lr: float = 1e-3
    classifier_weight_decay: float = 0.01
    hidden_dim: int | None = 64
    representation: str = "difference"
    warmup_steps: int = 0

    def __post_init__(self):
        _check(self.attribute in ATTRIBUTES, "debias.attribute", self.attribute,
               f"allowed values are {', '.join(map(repr, ATTRIBUTES))}")
        _check(self.representation in REPRESENTATIONS, "debias.representation", self.representation,
               f"allowed values are {', '.join(map(repr, REPRESENTATIONS))}")
        _check(self.gamma >= 0, "debias.gamma", self.gamma, "must be >= 0")
        _check(self.inner_steps >= 1, "debias.inner_steps", self.inner_steps, "must be >= 1")
        _check(self.micro_batches >= 1, "debias.micro_batches", self.micro_batches, "must be >= 1")
        _check(self.classifier_lr > 0, "debias.classifier_lr", self.classifier_lr, "must be > 0")
        _check(self.classifier_weight_decay >= 0, "debias.classifier_weight_decay",
               self.classifier_weight_decay, "must be >= 0")
        _check(self.warmup_steps >= 0, "debias.warmup_steps", self.warmup_steps, "must be >= 0")
        if self.hidden_dim is not None:
            _check(self.hidden_dim >= 1, "debias.hidden_dim", self.hidden_dim,
                   "must be >= 1 or null (linear)")


@dataclasses.dataclass(frozen=True)
class RMTrainConfig:
    steps: int = 300
    seed: int = 0
    eval_every: int = 100

    def __post_init__(self):
        _check(self.steps >= 0, "train.steps", self.steps, "must be >= 0")
        _check(self.eval_every >= 0, "train.eval_every", self.eval_every,
               "must be >= 0 (0 = only at the end)")


@dataclasses.dataclass(frozen=True)
class RMExperimentConfig:
    model: ModelConfig = ModelConfig(preset="tiny")
    tokenizer: TokenizerConfig = TokenizerConfig()
    data: RMDataConfig = RMDataConfig()
    debias: DebiasConfig = DebiasConfig()
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-3)
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    train: RMTrainConfig = RMTrainConfig()

    def __post_init__(self):
        if self.debias.enabled and self.data.batch_size % self.debias.micro_batches:
            raise ConfigError(f"debias.micro_batches={self.debias.micro_batches}: must divide "
                              f"data.batch_size={self.data.batch_size} (equal micro-batches)")


def load_rm_config(path: str | Path | None = None,
                   overrides: list[str] | tuple[str, ...] = ()) -> RMExperimentConfig:
    """Reads a YAML config (the embedded `configs/rm_length_bt.yaml` when `path` is None) plus `a.b=c`
    overrides.

    Raises:
      ConfigError: unreadable file, invalid YAML, unknown key (with the closest valid key), wrong type or
      value.
    """
    return load_yaml_config(RMExperimentConfig, path, overrides, DEFAULT_RM_CONFIG)


def dump_rm_config(cfg: RMExperimentConfig) -> str:
    """The resolved config as YAML (loads back to an equal config)."""
    return dump_yaml_config(cfg)
