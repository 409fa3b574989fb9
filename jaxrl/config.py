"""Typed experiment configuration: one frozen dataclass per component, composed into `ExperimentConfig`.

YAML files in `configs/` map 1:1 onto these dataclasses (levanter/draccus style). `load_config(path,
overrides)`
reads the YAML with `yaml.safe_load`, applies dotted `--set a.b=c` overrides (values parsed with
`yaml.safe_load`),
and builds the dataclasses; every unknown key, wrong type or invalid value raises `jaxrl.errors.ConfigError`
with
one message naming the full dotted key (and, for a misspelt key, the closest valid one). `dump_config` writes
the resolved YAML, which loads back to an equal config.

Only `jaxrl/cli.py` and the trainer read `ExperimentConfig`; everything below them takes small configs or
plain arguments (STYLE.md principle 13). The generic YAML <-> dataclass machinery lives in
`jaxrl/_config_io.py`.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
from pathlib import Path
from typing import Any


from jaxrl._checks import check as _check, check_choice as _check_choice
from jaxrl._config_io import dump_yaml_config, load_yaml_config, to_dict
from jaxrl.errors import ConfigError
from jaxrl.models.lora import LoraConfig
from jaxrl.algorithm_config import (  # noqa: F401 -- the algorithm section, re-exported
    Algo,
    AlgorithmConfig,
    BatchNorm,
    ClipSection,
    CLIPOSection,
    DAPOSection,
    DistillMode,
    DistillSection,
    ETRSection,
    GD2POMode,
    GD2POSection,
    GDPOSection,
    KLSection,
    KLWhere,
    MismatchLevel,
    MismatchMode,
    MismatchSection,
    Objective,
    ObjectiveSection,
    SFTSection,
)
from jaxrl.sharding.mesh import MeshConfig

DTYPES = ("float32", "bfloat16")
NORMS = ("pre", "post", "siamese", "siamese_hybrid")
REMATS = ("none", "full", "dots")
SCHEDULES = ("cosine", "constant")


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
    """`builtin` is the tiny character tokenizer of `jaxrl.tokenizer`; `path` an HF tokenizer directory."""

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


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Prompt source: `arithmetic` / `countdown` (built-in), `reasoning_gym:<task>`, or a .jsonl/.parquet
    path.

    `prompts_per_step` is the global number of prompts per RL step (split over hosts); `eval_size` prompts are
    held out; `target_format` turns a reference answer into the SFT target (warm start, sft_aux), or, when
    `target_formats` is given, each record's target uses one of those styles, picked by a hash of its prompt
    and the warm-start step (demonstrations in mixed styles); `params` go to the built-in generator or reasoning-gym.
    """

    source: str = "arithmetic"
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    prompts_per_step: int = 8
    train_size: int = 20000
    eval_size: int = 64
    system_prompt: str | None = None
    target_format: str = "<answer>{answer}</answer>"
    target_formats: tuple[str, ...] = ()
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    on_long_prompt: str = "error"  # a prompt longer than the rollout can take: "error" (exit 2) or "drop" it

    def __post_init__(self):
        _check(bool(self.source), "data.source", self.source, "must name a generator or a file")
        _check_choice("data.on_long_prompt", self.on_long_prompt, ("error", "drop"))
        for name in ("prompts_per_step", "train_size"):
            _check(getattr(self, name) >= 1, f"data.{name}", getattr(self, name), "must be >= 1")
        _check(self.eval_size >= 0, "data.eval_size", self.eval_size, "must be >= 0")
        for key, fmt in [("data.target_format", self.target_format)] + [
            (f"data.target_formats[{i}]", f) for i, f in enumerate(self.target_formats)
        ]:
            _check(
                "{answer}" in fmt,
                key,
                fmt,
                "must contain the placeholder {answer} (the SFT target is the answer in the expected format)",
            )


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Sampling of `group_size` completions per prompt; lengths are padded up to the nearest bucket."""

    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    prompt_buckets: tuple[int, ...] = (32, 64, 128, 256, 512)
    gen_buckets: tuple[int, ...] = ()
    logprobs_from_sampler: bool = False

    def __post_init__(self):
        _check(self.group_size >= 1, "rollout.group_size", self.group_size, "must be >= 1")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "must be >= 1")
        _check(self.temperature > 0, "rollout.temperature", self.temperature, "must be > 0")
        if self.top_k is not None:
            _check(self.top_k >= 1, "rollout.top_k", self.top_k, "must be >= 1 or null")
        if self.top_p is not None:
            _check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "must be in (0, 1] or null")
        for name in ("prompt_buckets", "gen_buckets"):
            b = getattr(self, name)
            _check(
                all(x >= 1 for x in b) and list(b) == sorted(set(b)),
                f"rollout.{name}",
                list(b),
                "must be strictly increasing positive integers",
            )


@dataclasses.dataclass(frozen=True)
class RewardSpec:
    """One reward: a built-in `type` (see `jaxrl.rewards.BUILTINS`) or `type: function` with `function:
    "module:function"`. `on_error`: 'zero' scores a failing call 0, 'skip' scores it NaN (excluded)."""

    name: str
    type: str = "function"
    weight: float = 1.0
    function: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    on_error: str = "zero"

    def __post_init__(self):
        _check(
            bool(self.name) and "/" not in self.name,
            "rewards.name",
            self.name,
            "a reward needs a non-empty name without '/'",
        )
        _check_choice(f"rewards[{self.name}].on_error", self.on_error, ("zero", "skip"))
        if self.type == "function":
            f = self.function or ""
            _check(
                f.count(":") == 1 and all(f.split(":")),
                f"rewards[{self.name}].function",
                self.function,
                "type 'function' needs function: 'package.module:function_name'",
            )


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """A multi-turn environment (`jaxrl.envs`): `name` is a built-in (`search`, `tools`; the adapters `gym`,
    `skyrl`, `trl` of other libraries' env APIs), "package.module:Class" or "path/file.py:Class"; `params` go
    to its constructor (checked against its signature at setup). Each
    episode has at most `max_turns` model turns of `rollout.max_new_tokens` tokens and `max_total_tokens` of
    context; `cache` is "reprefill" (rebuild the KV cache every turn) or "continue" (prefill only the new
    observation tokens). The episode return is reward column 0; `rewards:` add columns scored on the transcript.
    A step that breaks the `Env` contract, raises or runs past `step_timeout_s` seconds (null: no limit):
    with `on_error` "raise" the run stops (exit 2, one line); with "end_episode" that episode scores 0
    (`env/errors`), and an environment failing every episode for `train.max_failed_reward_steps` steps stops
    it (exit 2)."""

    name: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int = 4
    max_total_tokens: int = 512
    cache: str = "reprefill"
    on_error: str = "raise"
    step_timeout_s: float | None = None

    def __post_init__(self):
        _check(bool(self.name), "env.name", self.name, "must name an environment")
        _check(self.max_turns >= 1, "env.max_turns", self.max_turns, "must be >= 1")
        _check(self.max_total_tokens >= 1, "env.max_total_tokens", self.max_total_tokens, "must be >= 1")
        _check_choice("env.cache", self.cache, ("reprefill", "continue"))
        _check_choice("env.on_error", self.on_error, ("raise", "end_episode"))
        _check(self.step_timeout_s is None or self.step_timeout_s > 0, "env.step_timeout_s",
               self.step_timeout_s, "must be > 0 seconds, or null for no limit")


@dataclasses.dataclass(frozen=True)
class MultiAgentConfig:
    """A multi-agent system played by the one policy (`jaxrl.multi_agent`): `system` is a built-in (`march`),
    `params` go to its constructor (checked at setup). It replaces the collect stage; the SFT warm start
    trains on its role-format demonstrations. `adapters`: "shared" (every role samples and trains the one
    policy) or "per_role" (with `model.lora`: one adapter set and optimiser state per role over the shared
    frozen base, `jaxrl.multi_agent.adapters`). `estimators`: role -> the advantage estimator of that role's
    rows instead of `algorithm.name`'s (an estimator-only algorithm: grpo, dr_grpo, rloo, gdpo, gd2po, etr),
    e.g. `{solver: rloo}`; each role's estimator runs on its own rows with its own group size."""

    system: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    adapters: str = "shared"
    estimators: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _check(bool(self.system), "multi_agent.system", self.system, "must name a system")
        _check_choice("multi_agent.adapters", self.adapters, ("shared", "per_role"))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """optax AdamW; linear warm-up, then cosine decay to `lr * final_lr_frac` (or constant); clip by norm."""

    lr: float = 1e-5
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "constant"
    final_lr_frac: float = 0.1
    clip_norm: float | None = 1.0
    max_nonfinite_steps: int = 5

    def __post_init__(self):
        _check(self.lr > 0, "optimizer.lr", self.lr, "must be > 0")
        for name in ("b1", "b2"):
            _check(
                0 <= getattr(self, name) < 1, f"optimizer.{name}", getattr(self, name), "must be in [0, 1)"
            )
        _check(self.weight_decay >= 0, "optimizer.weight_decay", self.weight_decay, "must be >= 0")
        _check(self.warmup_steps >= 0, "optimizer.warmup_steps", self.warmup_steps, "must be >= 0")
        _check_choice("optimizer.schedule", self.schedule, SCHEDULES)
        _check(
            0 <= self.final_lr_frac <= 1, "optimizer.final_lr_frac", self.final_lr_frac, "must be in [0, 1]"
        )
        if self.clip_norm is not None:
            _check(self.clip_norm > 0, "optimizer.clip_norm", self.clip_norm, "must be > 0 or null")
        _check(
            self.max_nonfinite_steps >= 1,
            "optimizer.max_nonfinite_steps",
            self.max_nonfinite_steps,
            "must be >= 1",
        )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints in RUN/checkpoints: every `every` steps, keep the last `keep`; `resume` latest."""

    every: int = 50
    keep: int = 2
    async_save: bool = True
    resume: bool = True

    def __post_init__(self):
        _check(self.every >= 1, "checkpoint.every", self.every, "must be >= 1")
        _check(self.keep >= 1, "checkpoint.keep", self.keep, "must be >= 1")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases options (needs the `wandb` extra). The run's files go to RUN/wandb; `mode: offline`
    needs no network (upload later with `wandb sync RUN/wandb/offline-run-*`); `disabled` makes every wandb
    call a no-op. `entity`: the user or team (null: the account's default); `name`: the run's display name."""

    project: str = "jaxrl"
    entity: str | None = None
    mode: str = "offline"
    name: str | None = None

    def __post_init__(self):
        _check_choice("logging.wandb.mode", self.mode, ("online", "offline", "disabled"))
        _check(bool(self.project), "logging.wandb.project", self.project, "must be a non-empty name")


@dataclasses.dataclass(frozen=True)
class MlflowConfig:
    """MLflow options (needs the `mlflow` extra, mlflow-skinny). `tracking_uri` null: a local file store in
    RUN/mlruns (`mlflow ui --backend-store-uri RUN/mlruns`); `experiment`: the experiment's name; `run_name`:
    the run's display name (null: MLflow picks one)."""

    tracking_uri: str | None = None
    experiment: str = "jaxrl"
    run_name: str | None = None

    def __post_init__(self):
        _check(bool(self.experiment), "logging.mlflow.experiment", self.experiment,
               "must be a non-empty name")


TRACKERS = ("tensorboard", "wandb", "mlflow")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """`every`: steps between plain log lines when `progress_bar` is off. `trackers`: where metrics and
    samples go besides RUN/metrics.jsonl (always written): any of `tensorboard` (RUN/tb), `wandb`, `mlflow`;
    options in `wandb:` / `mlflow:`.

    One rule joins `trackers` and the older `tensorboard` switch: without `trackers` the list is `tensorboard`
    unless `tensorboard: false`, plus `wandb` / `mlflow` when their options are given; with `trackers`, a
    `tensorboard` switch or an options section that disagrees with the list is refused. After construction
    `trackers` is that list, `tensorboard` says whether it names TensorBoard, and each listed tracker has its
    options (defaults when none were given).
    """

    every: int = 1
    sample_every: int = 10
    num_samples: int = 4
    trackers: tuple[str, ...] | None = None
    tensorboard: bool | None = None
    progress_bar: bool = True
    wandb: WandbConfig | None = None
    mlflow: MlflowConfig | None = None

    def __post_init__(self):
        for name in ("every", "sample_every"):
            _check(getattr(self, name) >= 1, f"logging.{name}", getattr(self, name), "must be >= 1")
        _check(self.num_samples >= 0, "logging.num_samples", self.num_samples, "must be >= 0")
        options = {"wandb": self.wandb, "mlflow": self.mlflow}
        if self.trackers is None:
            names = ("tensorboard",) * (self.tensorboard is not False)
            names += tuple(name for name, given in options.items() if given is not None)
        else:
            names = self.trackers
            for i, name in enumerate(names):
                _check_choice(f"logging.trackers[{i}]", name, TRACKERS)
            _check(len(set(names)) == len(names), "logging.trackers", list(names), "names a tracker twice")
            agrees = self.tensorboard is None or self.tensorboard == ("tensorboard" in names)
            _check(agrees, "logging.tensorboard", self.tensorboard,
                   f"contradicts logging.trackers={list(names)}; drop one of the two")
            for name, given in options.items():
                if given is not None and name not in names:
                    raise ConfigError(f"logging.{name} holds options of a tracker that logging.trackers="
                                      f"{list(names)} does not name; add {name} to the list or remove "
                                      f"logging.{name}")
        # frozen: normalise once, at construction (the saved config.yaml then loads back to an equal config)
        object.__setattr__(self, "trackers", tuple(names))
        object.__setattr__(self, "tensorboard", "tensorboard" in names)
        if "wandb" in names and self.wandb is None:
            object.__setattr__(self, "wandb", WandbConfig())
        if "mlflow" in names and self.mlflow is None:
            object.__setattr__(self, "mlflow", MlflowConfig())


@dataclasses.dataclass(frozen=True)
class SFTWarmupConfig:
    """Supervised warm start on the data's reference answers before RL (0 steps = off)."""

    steps: int = 0
    lr: float = 1e-3
    batch_size: int = 16
    # true: several demonstrations per row (`jaxrl.packing`, same loss and gradient); false (default): padded
    # rows. Opt-in until a cache-loaded packed step's collective deadlock is understood (docs/TESTING.md)
    packing: bool = False

    def __post_init__(self):
        _check(self.steps >= 0, "sft_warmup.steps", self.steps, "must be >= 0")
        _check(self.lr > 0, "sft_warmup.lr", self.lr, "must be > 0")
        _check(self.batch_size >= 1, "sft_warmup.batch_size", self.batch_size, "must be >= 1")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
    """Asynchronous RL (`jaxrl.rl.ahead`): the rollout of step t is sampled by the policy as it was
    `max_staleness` updates before the trainer's (fewer in the first steps), so the next rollout is collected
    while the trainer updates on this one. 0 (default): synchronous, today's step exactly."""

    max_staleness: int = 0

    def __post_init__(self):
        _check(self.max_staleness >= 0, "train.async.max_staleness", self.max_staleness,
               "must be >= 0 (0 = synchronous; k >= 1: rollouts sampled up to k policy versions behind)")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """`max_failed_reward_steps`: consecutive steps on which a reward may fail (raise or give NaN) on every
    sample before the run stops with that reward's first error. `eval_samples` k > 1: the held-out evaluation
    also samples k completions per prompt (rollout temperature) and reports avg@k and unbiased pass@j.
    `share_prompts`: run each prompt once for the G completions of its group in the update and the old /
    reference log-prob passes (`jaxrl.models.shared_prompt`; same numbers up to float summation order).
    "auto": wherever the batch keeps whole groups (`jaxrl.rl.batch.prompt_groups` lists the cases that fall
    back to the unshared forward), "always": the same, but a batch that cannot is an error, "never": off."""

    steps: int = 100
    seed: int = 0
    eval_every: int = 20
    max_failed_reward_steps: int = 3
    eval_samples: int = 1
    share_prompts: str = "auto"
    async_: AsyncConfig = AsyncConfig()  # the key `train.async` (`jaxrl._config_io.config_key`)

    def __post_init__(self):
        _check(self.eval_samples >= 1, "train.eval_samples", self.eval_samples,
               "must be >= 1 (k > 1 adds eval/avg@k and eval/pass@j from k sampled completions per prompt)")
        _check(self.max_failed_reward_steps >= 1, "train.max_failed_reward_steps", self.max_failed_reward_steps,
               "must be >= 1")
        _check(self.steps >= 0, "train.steps", self.steps, "must be >= 0")
        _check(self.eval_every >= 0, "train.eval_every", self.eval_every, "must be >= 0 (0 = never)")
        _check_choice("train.share_prompts", self.share_prompts, ("auto", "always", "never"))


# The world (corpus_seed, corpus_size) by default of data.source "entities" (`jaxrl.data.tasks.entities`), env
# "search" (`jaxrl.envs.SearchEnv`) and multi_agent "march" (`jaxrl.multi_agent.MarchSystem`); a test holds
# them equal to those signatures' defaults.
WORLD_DEFAULTS = {"corpus_seed": 0, "corpus_size": "tiny"}


def _world(params: dict[str, Any]) -> tuple[Any, Any]:
    return tuple(params.get(k, v) for k, v in WORLD_DEFAULTS.items())


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    model: ModelConfig = ModelConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    rewards: tuple[RewardSpec, ...] = ()
    optimizer: OptimizerConfig = OptimizerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    mesh: MeshConfig = MeshConfig()
    sft_warmup: SFTWarmupConfig = SFTWarmupConfig()
    train: TrainConfig = TrainConfig()
    env: EnvConfig | None = None
    multi_agent: MultiAgentConfig | None = None

    def __post_init__(self):
        _check(self.env is None or self.multi_agent is None, "multi_agent", self.multi_agent and
               self.multi_agent.system, "a multi-agent system collects its own rows; remove the env section")
        _check(self.multi_agent is None or self.multi_agent.adapters == "shared" or self.model.lora is not None,
               "multi_agent.adapters", self.multi_agent and self.multi_agent.adapters,
               "per_role adapters need model.lora (one LoRA adapter set per role over the frozen base)")
        self._check_same_world()
        names = [r.name for r in self.rewards]
        dup = sorted({n for n in names if names.count(n) > 1})
        _check(not dup, "rewards", dup, "reward names must be unique")
        from jaxrl.algorithms import ALGORITHMS, resolve  # the registry; algorithms never import this module

        algo = resolve(self.algorithm.name)  # a user's record ("module:attr") is registered here
        _check(algo is not None, "algorithm.name", self.algorithm.name,
               f"allowed values are {', '.join(map(repr, ALGORITHMS))}, or an Algorithm record of your own "
               "('package.module:attr')")
        if self.multi_agent is not None and self.multi_agent.estimators:
            self._check_role_estimators(algo)
        if algo.per_reward and self.algorithm.kl.beta > 0:
            _check(self.algorithm.kl.where is KLWhere.LOSS, "algorithm.kl.where", self.algorithm.kl.where.value,
                   f"{algo.name} normalises each reward column within its group, which would erase β of a KL "
                   "penalty in the reward; use kl.where: loss (as its reference implementations do)")
        # Every algorithm here normalises rewards within a group of samples of the same prompt.
        _check(
            self.rollout.group_size >= 2,
            "rollout.group_size",
            self.rollout.group_size,
            "group-relative algorithms need group_size >= 2",
        )
        for r in self.rewards:  # a pairwise judge compares the G completions of one prompt: its groups
            if r.type == "pairwise" and "group_size" in r.params:  # are the rollout's groups
                _check(r.params["group_size"] == self.rollout.group_size,
                       f"rewards[{r.name}].params.group_size", r.params["group_size"],
                       f"must equal rollout.group_size={self.rollout.group_size}")

    def _check_same_world(self) -> None:
        """A built-in world environment (search, MARCH) must search the world its questions come from: with
        another one every question is unanswerable (issue 30 item 8)."""
        if self.data.source != "entities":
            return
        env = (("env.params", self.env.params) if self.env is not None and self.env.name == "search" else
               ("multi_agent.params", self.multi_agent.params)
               if self.multi_agent is not None and self.multi_agent.system == "march" else None)
        if env is not None:
            mine, data = _world(env[1]), _world(self.data.params)
            _check(mine == data, f"{env[0]}.(corpus_seed, corpus_size)", mine,
                   f"differs from data.params' {data}: the environment would search another world than its "
                   "questions'; give both the same corpus_seed and corpus_size")

    def _check_role_estimators(self, algo) -> None:
        """`multi_agent.estimators`: estimator-only algorithms, under a run algorithm without group-wide
        stages, and no per-reward normalisation of a KL penalty in the reward. Which roles exist and are
        trained, and their group sizes, are the system's (checked at setup)."""
        from jaxrl.algorithms import ALGORITHMS, ESTIMATOR_ONLY

        _check(algo.name in ESTIMATOR_ONLY, "algorithm.name", algo.name,
               f"multi_agent.estimators gives roles their own estimator, which needs a run algorithm without "
               f"resampling, reward shaping or extra rows: {', '.join(ESTIMATOR_ONLY)}")
        kl = self.algorithm.kl
        for role, name in self.multi_agent.estimators.items():
            key = f"multi_agent.estimators.{role}"
            _check(name in ESTIMATOR_ONLY, key, name, f"allowed values are {', '.join(map(repr, ESTIMATOR_ONLY))}")
            _check(not (ALGORITHMS[name].per_reward and kl.beta > 0 and kl.where is not KLWhere.LOSS), key, name,
                   f"{name} normalises each reward column within its group, which would erase β of a KL penalty "
                   "in the reward; use algorithm.kl.where: loss")


DEFAULT_CONFIG = "quickstart.yaml"


def default_config_text() -> str:
    """The embedded default `configs/quickstart.yaml` (package data of `jaxrl.configs`)."""
    return importlib.resources.files("jaxrl.configs").joinpath(DEFAULT_CONFIG).read_text()


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> ExperimentConfig:
    """Reads a YAML config (or the embedded default when `path` is None) and applies `a.b=c` overrides.

    Raises:
      ConfigError: unreadable file, YAML error, unknown key (with the closest valid key), wrong type or
        invalid value; the message names the full dotted key.
    """
    return load_yaml_config(ExperimentConfig, path, overrides, DEFAULT_CONFIG)


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML; `load_config` of it gives back an equal `ExperimentConfig`."""
    return dump_yaml_config(cfg)


def config_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The resolved config as plain data (what `dump_config` writes), for experiment trackers."""
    return to_dict(cfg)


def save_config(cfg: ExperimentConfig, run_dir: str | Path) -> Path:
    """Writes the resolved `config.yaml` into the run directory."""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(cfg))
    return path
