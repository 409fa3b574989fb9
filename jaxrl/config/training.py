"""The sections that say how a run trains, saves and reports: `optimizer:`, `checkpoint:`, `logging:` (with
`wandb:` and `mlflow:`), `sft_warmup:`, `train:` (with `train.async`)."""

from __future__ import annotations

import dataclasses

from jaxrl._checks import check as _check, check_choice as _check_choice
from jaxrl.errors import ConfigError

SCHEDULES = ("cosine", "constant")


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
    # true: several demonstrations per row (`jaxrl.rl.packing`, same loss and gradient up to summation order);
    # false (default): padded rows. The cache-loaded deadlock that kept it opt-in was jaxlib's, now avoided
    # (`jaxrl.runtime.compile_cache`); on by default it would move every shipped config's documented results
    packing: bool = False

    def __post_init__(self):
        _check(self.steps >= 0, "sft_warmup.steps", self.steps, "must be >= 0")
        _check(self.lr > 0, "sft_warmup.lr", self.lr, "must be > 0")
        _check(self.batch_size >= 1, "sft_warmup.batch_size", self.batch_size, "must be >= 1")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
    """Asynchronous RL (`jaxrl.rl.ahead`): the rollout of step t is sampled by the policy as it was
    `max_staleness` updates before the trainer's (fewer in the first steps), so the next rollout is collected
    while the trainer updates on this one. 0 (default): synchronous, today's step exactly. `partial_rollouts`
    (k >= 1, single-turn): a completion still in flight halfway through its token budget continues under the
    newest weights (`jaxrl.rl.partial`); each token records the version that sampled it."""

    max_staleness: int = 0
    partial_rollouts: bool = False

    def __post_init__(self):
        _check(self.max_staleness >= 0, "train.async.max_staleness", self.max_staleness,
               "must be >= 0 (0 = synchronous; k >= 1: rollouts sampled up to k policy versions behind)")
        _check(not self.partial_rollouts or self.max_staleness >= 1, "train.async.partial_rollouts", True,
               "needs train.async.max_staleness >= 1 (a synchronous run has no newer weights to continue under)")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """`max_failed_reward_steps`: consecutive steps on which a reward may fail (raise or give NaN) on every
    sample before the run stops with that reward's first error. `eval_samples` k > 1: the held-out evaluation
    also samples k completions per prompt (rollout temperature) and reports avg@k and unbiased pass@j.
    `eval_batch_size`: held-out prompts per generation call (None: `data.prompts_per_step`, the rollout's own
    batch); a larger one evaluates in fewer, wider calls (one more sampler compile).
    `share_prompts`: run each prompt once for the G completions of its group in the update and the old /
    reference log-prob passes (`jaxrl.models.shared_prompt`; same numbers up to float summation order).
    "auto": wherever the batch keeps whole groups (`jaxrl.rl.batch.prompt_groups` lists the cases that fall
    back to the unshared forward), "always": the same, but a batch that cannot is an error, "never": off.
    `packing`: "auto" runs the update's forward, on every mini-batch, in the layout that computes least
    (`jaxrl.rl.packing.rl_plan`; the loss and gradient of the padded rows up to float summation order): packed
    rows (several rows' real tokens end to end in rows of the batch's width, no attention across sequences),
    unpadded rows (each block's real tokens end to end in one row, attention on the padded rows:
    `jaxrl.models.unpadded`; where no two rows fit one packed row, e.g. uniform lengths) or the padded (or
    shared-prompt) forward; "rows" / "unpadded": only that layout, where it computes less; "off" (default):
    padded rows. Off by default so that the shipped configs' recorded results stay as they are; the pod
    configs pack."""

    steps: int = 100
    seed: int = 0
    eval_every: int = 20
    max_failed_reward_steps: int = 3
    eval_samples: int = 1
    eval_batch_size: int | None = None
    share_prompts: str = "auto"
    packing: str = "off"
    async_: AsyncConfig = AsyncConfig()  # the key `train.async` (`jaxrl.config.io.config_key`)

    def __post_init__(self):
        _check(self.eval_samples >= 1, "train.eval_samples", self.eval_samples,
               "must be >= 1 (k > 1 adds eval/avg@k and eval/pass@j from k sampled completions per prompt)")
        _check(self.eval_batch_size is None or self.eval_batch_size >= 1, "train.eval_batch_size",
               self.eval_batch_size, "must be >= 1 (null: data.prompts_per_step)")
        _check(self.max_failed_reward_steps >= 1, "train.max_failed_reward_steps", self.max_failed_reward_steps,
               "must be >= 1")
        _check(self.steps >= 0, "train.steps", self.steps, "must be >= 0")
        _check(self.eval_every >= 0, "train.eval_every", self.eval_every, "must be >= 0 (0 = never)")
        _check_choice("train.share_prompts", self.share_prompts, ("auto", "always", "never"))
        _check_choice("train.packing", self.packing, ("auto", "rows", "unpadded", "off"))

