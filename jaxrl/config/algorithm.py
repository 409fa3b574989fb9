"""The `algorithm:` section of the experiment config: the shared settings and one typed sub-section per method.

Re-exported by `jaxrl.config`; `jaxrl.rl.setup.setup` reads it once into `AlgoSettings` and a `LossSpec`.
Choices are enums (the libraries' own where they exist: `losses.AggMode`, `losses.KLKind`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, Mapping

from jaxrl._checks import check as _check
from jaxrl.config.io import from_dict
from jaxrl.errors import ConfigError
from jaxrl.losses import AggMode, KLKind


class Algo(str, enum.Enum):
    """RL algorithms selectable with `algorithm.name` (see shared spec/algorithms.md)."""

    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    DAPO = "dapo"
    RLOO = "rloo"
    GDPO = "gdpo"
    GD2PO = "gd2po"
    ETR = "etr"
    CLIPO = "clipo"
    SFT_AUX = "sft_aux"
    REINFORCE_PP = "reinforce_pp"
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"
    PPO = "ppo"


class KLWhere(str, enum.Enum):
    """Where the reference KL acts: a term of the loss (GRPO, TRL `beta`) or a penalty in the reward (PPO)."""

    LOSS = "loss"
    REWARD = "reward"


class DistillMode(str, enum.Enum):
    """How on-policy distillation uses the teacher's log-probs of the student's sampled tokens: as a dense
    per-token reward in the advantages (Thinking Machines / tinker-cookbook), or as a KL term of the loss."""

    REWARD = "reward"
    REVERSE_KL_LOSS = "reverse_kl_loss"


@dataclasses.dataclass(frozen=True)
class ClipSection:
    """PPO clip: ratio in [1 - low, 1 + high] (DAPO clip-higher: 0.2/0.28); `dual`: c of dual-clip or null."""

    low: float = 0.2
    high: float = 0.2
    dual: float | None = None

    def __post_init__(self):
        _check(0 <= self.low < 1, "algorithm.clip.low", self.low, "must be in [0, 1)")
        _check(self.high >= 0, "algorithm.clip.high", self.high, "must be >= 0")
        if self.dual is not None:
            _check(self.dual > 1, "algorithm.clip.dual", self.dual, "must be > 1 or null")


@dataclasses.dataclass(frozen=True)
class KLSection:
    """KL to the reference policy: β (`beta`, 0 keeps no reference model), estimator, loss or reward."""

    beta: float = 0.0
    kind: KLKind = KLKind.K3
    where: KLWhere = KLWhere.LOSS

    def __post_init__(self):
        _check(self.beta >= 0, "algorithm.kl.beta", self.beta, "must be >= 0")


@dataclasses.dataclass(frozen=True)
class DistillSection:
    """On-policy distillation (`jaxrl.rl.distill`): the student samples, a frozen `teacher` (any checkpoint
    jaxrl loads: a run or checkpoint directory, or an HF safetensors directory, with the student's tokenizer)
    scores the sampled tokens, and the per-token reverse KL d_t = log π_old(y_t) − log π_T(y_t) trains the
    student, alone (task rewards of weight 0) or mixed with task rewards:

      mode reward           A_t += −coef · Σ_{k≥t} γ^{k−t} d_k   (γ = `discount`, 0: A_t −= coef·d_t; after the
                            advantage estimator's normalisation; tinker-cookbook `incorporate_kl_penalty`)
      mode reverse_kl_loss  loss += coef · aggregate(k(log π_θ, log π_T))   (`kind`, default k2: on the
                            student's own samples the gradient of k2 = ½(log π_θ − log π_T)² is that of
                            KL(π_θ ‖ π_T), Agarwal et al. GKD arXiv:2306.13649 with λ = 1; k3 would give the
                            forward KL's)
    """

    teacher: str | None = None
    coef: float = 1.0
    mode: DistillMode = DistillMode.REWARD
    kind: KLKind = KLKind.K2
    discount: float = 0.0

    def __post_init__(self):
        _check(self.coef > 0, "algorithm.distill.coef", self.coef, "must be > 0")
        _check(0 <= self.discount <= 1, "algorithm.distill.discount", self.discount, "must be in [0, 1]")
        if self.teacher is not None:
            _check(isinstance(self.teacher, str) and self.teacher.strip() != "", "algorithm.distill.teacher",
                   self.teacher, "must be a path (a jaxrl run / checkpoint directory or an HF directory)")


@dataclasses.dataclass(frozen=True)
class PPOSection:
    """PPO with a learned critic (`algorithm.name: ppo`, `jaxrl.rl.critic`): GAE(γ, λ) over the completion
    tokens with the reward at the last token, advantages whitened over the batch's tokens (`whiten`), and a
    value model trained with its own AdamW (`critic_lr`; null: `optimizer.lr`) on the clipped value loss
    (`value_clip`: verl's `cliprange_value`; null: unclipped). `critic_init`: `policy` (the model RL starts
    from, after the SFT warm start, with a fresh value head) or a path (a jaxrl run / checkpoint directory, an
    HF directory, or a reward model trained by `jaxrl train-rm`, whose head it keeps). `critic_lora` (with
    `model.lora`): the critic is adapters of its own (the policy's rank, α, targets) over the policy's frozen
    base and a head, fresh (the trunk starts as the base), instead of a second full trunk. The first
    `critic_warmup_steps` steps update the critic only (verl's `critic_warmup` = this + 1). Defaults: verl's
    (γ = λ = 1, value clip 0.5)."""

    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float | None = 0.5
    whiten: bool = True
    critic_lr: float | None = None
    critic_init: str = "policy"
    critic_warmup_steps: int = 0
    critic_lora: bool = False

    def __post_init__(self):
        _check(0 <= self.gamma <= 1, "algorithm.ppo.gamma", self.gamma, "must be in [0, 1]")
        _check(0 <= self.lam <= 1, "algorithm.ppo.lam", self.lam, "must be in [0, 1]")
        _check(self.value_clip is None or self.value_clip > 0, "algorithm.ppo.value_clip", self.value_clip,
               "must be > 0 or null")
        _check(self.critic_lr is None or self.critic_lr > 0, "algorithm.ppo.critic_lr", self.critic_lr,
               "must be > 0 or null")
        _check(isinstance(self.critic_init, str) and self.critic_init.strip() != "", "algorithm.ppo.critic_init",
               self.critic_init, "must be 'policy' or a path to a model")
        _check(self.critic_warmup_steps >= 0, "algorithm.ppo.critic_warmup_steps", self.critic_warmup_steps,
               "must be >= 0")
        _check(not (self.critic_lora and self.critic_init != "policy"), "algorithm.ppo.critic_lora",
               self.critic_lora, "a LoRA critic sits on the policy's base: leave critic_init at 'policy'")


@dataclasses.dataclass(frozen=True)
class ObjectiveSection:
    """Which policy objective (`name`: a key of `jaxrl.learner.objectives.OBJECTIVES`, or a record of your own
    "path/file.py:RECORD") and its own hyper-parameters (`params`, checked at load against the record's class:
    GSPO's `clip_low` / `clip_high`, CISPO's `w_max` / `w_min`, SAPO's `tau_pos` / `tau_neg`). `ppo_clip`
    uses `algorithm.clip` (and ETR's elastic bounds)."""

    name: str = "ppo_clip"
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "gspo_low": "params.clip_low", "gspo_high": "params.clip_high", "cispo_w_max": "params.w_max",
        "cispo_w_min": "params.w_min", "sapo_tau_pos": "params.tau_pos", "sapo_tau_neg": "params.tau_neg",
    }
    RETIRED_DEFAULTS: ClassVar[dict[str, Any]] = {  # as `AlgorithmConfig.RETIRED_DEFAULTS`
        "gspo_low": 3e-4, "gspo_high": 4e-4, "cispo_w_max": 1.2, "cispo_w_min": None, "sapo_tau_pos": 1.0,
        "sapo_tau_neg": 1.05,
    }


class MismatchMode(str, enum.Enum):
    """Correction of the sampler/trainer log-prob mismatch: none, truncated IS (TIS) or masked IS (MIS)."""

    OFF = "off"
    TIS = "tis"
    MIS = "mis"


class MismatchLevel(str, enum.Enum):
    TOKEN = "token"
    SEQUENCE = "sequence"
    GEOMETRIC = "geometric"


class MismatchReject(str, enum.Enum):
    """What MIS does with a rejected token (`losses.rollout_correction(reject=...)`): drop it from the mask,
    so it leaves every denominator and the KL term (verl's rejection sampling, default), or keep it with
    policy weight 0 (TRL's `token_mask` / `sequence_mask`)."""

    MASK = "mask"
    ZERO_WEIGHT = "zero_weight"


@dataclasses.dataclass(frozen=True)
class MismatchSection:
    """Train-inference mismatch (`losses.rollout_correction`): the importance weight π_trainer / π_sampler of
    each sampled token (or sequence) multiplies the policy loss (TIS: clipped to [lower, upper]; MIS: tokens or
    sequences outside the band get weight 0 and, with `reject: mask` (verl, default), leave the mask; with
    `reject: zero_weight` (TRL) they stay in it). Any mode other than `off` recomputes the old log-probs with
    the trainer, and the step logs `mismatch/*` whenever both log-probs exist."""

    mode: MismatchMode = MismatchMode.OFF
    level: MismatchLevel = MismatchLevel.TOKEN
    lower: float | None = None
    upper: float | None = 2.0
    reject: MismatchReject = MismatchReject.MASK

    def __post_init__(self):
        _check(self.lower is not None or self.upper is not None, "algorithm.mismatch",
               (self.lower, self.upper), "set at least one of lower, upper")
        if self.lower is not None and self.upper is not None:
            _check(0 <= self.lower <= self.upper, "algorithm.mismatch.lower", self.lower,
                   "must be in [0, upper]")


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """Advantage estimator, policy objective, aggregation and their hyper-parameters (spec/algorithms.md).

    `name` is a key of `jaxrl.algorithms.ALGORITHMS` (built-ins: the `Algo` values). A method's own
    hyper-parameters are `params`, checked at load against its record's parameter class (`Algorithm.params`,
    e.g. `jaxrl.algorithms.ETRParams`; a user's record declares its own: `algorithm_params`). `clip`, `kl`,
    `objective`, `mismatch` and `distill` are shared by every method; `ppo` configures the critic and its GAE
    (the `ActorCritic` schedule of a method with a critic). The sub-sections of earlier versions (`etr`,
    `gd2po`, `clipo`, `dapo`, `sft`, `gdpo`, `reinforce_pp`) and their flat keys (`etr_alpha`, ...) are
    refused with their new place.

    `agg_mode` left unset (null) resolves at load to the policy objective's reference aggregation
    (`PolicyObjective.agg`): token-mean for `ppo_clip` (verl's default) and `cispo` (the paper's 1/Σ|o_i|),
    seq-mean-token-mean for `gspo`, `gspo_token` and `sapo` (their papers' mean over responses; verl
    hard-codes it, TRL warns that a length-weighted GSPO "does not reproduce the GSPO paper"). The resolved
    config names the mode.
    """

    name: str = "grpo"
    agg_mode: AggMode | None = None
    adv_eps: float = 1e-6
    entropy_coef: float = 0.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    grad_accum: int = 1
    clip: ClipSection = ClipSection()
    kl: KLSection = KLSection()
    ppo: PPOSection = PPOSection()
    objective: ObjectiveSection = ObjectiveSection()
    mismatch: MismatchSection = MismatchSection()
    distill: DistillSection = DistillSection()
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # the record's own (`algorithm_params`)

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "clip_low": "clip.low", "clip_high": "clip.high", "dual_clip": "clip.dual",
        "kl_beta": "kl.beta", "kl_kind": "kl.kind", "kl_in": "kl.where",
        # a method's own settings: its record's parameters (`algorithm.params`, with `algorithm.name` the method)
        "etr_alpha": "params.alpha", "etr_beta": "params.beta", "etr_adv_max": "params.adv_max",
        "gd2po_mode": "params.mode", "gd2po_tau": "params.tau",
        "clipo_tau": "params.tau", "clipo_lambda": "params.lam", "clipo_head_dim": "params.head_dim",
        "clipo_lr": "params.lr", "clipo_warmup_steps": "params.warmup_steps",
        "sft_lambda": "params.lam", "dynamic_sampling_max_tries": "params.max_tries",
        "etr": "params", "gdpo": "params", "gd2po": "params", "clipo": "params", "dapo": "params",
        "sft": "params", "reinforce_pp": "params",
    }
    # What every resolved config of the earlier layout holds (its dump wrote each method's defaults): read as
    # absent, so such a run's config.yaml still loads (`jaxrl eval --checkpoint`); any other value is refused
    # with its new place (`MOVED_KEYS`).
    RETIRED_DEFAULTS: ClassVar[dict[str, Any]] = {
        "etr": {"alpha": 0.0, "beta": 0.0, "adv_max": 3.0}, "gdpo": {"batch_norm": "sample"},
        "gd2po": {"mode": "hard", "tau": 0.2, "eps_snr": 1e-6},
        "clipo": {"tau": 0.05, "lam": 0.2, "head_dim": 512, "lr": 1e-3, "warmup_steps": 0},
        "dapo": {"max_tries": 8, "filter_rewards": []}, "sft": {"lam": 0.1}, "reinforce_pp": {"gamma": 1.0},
    }

    def __post_init__(self):
        from jaxrl.learner.objectives import OBJECTIVES, PARAMS_KEY, resolve  # the registry (lazy: jax)

        objective = resolve(self.objective.name)  # a user's record ("module:attr") is registered here
        _check(objective is not None, "algorithm.objective.name", self.objective.name,
               f"allowed values are {', '.join(map(repr, OBJECTIVES))}, or a PolicyObjective record of your "
               "own ('package.module:attr')")
        record_params(objective.params, self.objective.params, objective.name, PARAMS_KEY)
        if self.agg_mode is None:  # resolved once here, so the trainer and the saved config see the mode
            object.__setattr__(self, "agg_mode", objective.agg)
        _check(self.adv_eps > 0, "algorithm.adv_eps", self.adv_eps, "must be > 0")
        _check(self.entropy_coef >= 0, "algorithm.entropy_coef", self.entropy_coef, "must be >= 0")
        for name in ("ppo_epochs", "mini_batches", "grad_accum"):
            _check(getattr(self, name) >= 1, f"algorithm.{name}", getattr(self, name), "must be >= 1")


def record_params(params_cls: type | None, raw: Mapping[str, Any], name: str, key: str) -> Any:
    """A plug-in's parameters (`key`: "algorithm.params" of an `Algorithm` record, "algorithm.objective.params"
    of a `PolicyObjective`) as its record's parameter class: unknown keys, wrong types and the class's own
    checks fail as one-line ConfigErrors naming `<key>.<field>`, at load.

    Args:
      params_cls: the record's dataclass of hyper-parameters; None when it declares none (then `raw` must be
        empty).
      raw: the config's mapping.
      name: the record's name, for the message.
      key: the config key of the mapping.
    """
    if params_cls is None:
        _check(not raw, key, dict(raw), f"{name!r} declares no parameters")
        return None
    try:
        return from_dict(params_cls, dict(raw), key)
    except (TypeError, ValueError) as e:  # the class's own __post_init__ checks
        raise ConfigError(f"{key} of {name!r}: {e}") from None


def algorithm_params(params_cls: type | None, raw: Mapping[str, Any], name: str) -> Any:
    """`algorithm.params` as the algorithm record's parameter class (`Algorithm.params`; `record_params`)."""
    return record_params(params_cls, raw, name, "algorithm.params")
