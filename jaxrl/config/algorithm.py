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


class GD2POMode(str, enum.Enum):
    """GD²PO conflict filter: drop every conflicting sample, or only those with a small signal-to-noise."""

    HARD = "hard"
    SNR = "snr"


class BatchNorm(str, enum.Enum):
    """GDPO's batch standardisation of the summed advantages: over samples (TRL) or over tokens (verl)."""

    SAMPLE = "sample"
    TOKEN = "token"


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
class ETRSection:
    """ETR elastic clip bounds [READING] (`losses.etr`): elasticities α, β and the advantage cap."""

    alpha: float = 0.0
    beta: float = 0.0
    adv_max: float = 3.0

    def __post_init__(self):
        for name in ("alpha", "beta", "adv_max"):
            _check(getattr(self, name) >= 0, f"algorithm.etr.{name}", getattr(self, name), "must be >= 0")


@dataclasses.dataclass(frozen=True)
class GDPOSection:
    """GDPO (`losses.gdpo`): `batch_norm` sample (TRL, default) or token (verl form, as GD²PO uses)."""

    batch_norm: BatchNorm = BatchNorm.SAMPLE


@dataclasses.dataclass(frozen=True)
class GD2POSection:
    """GD²PO conflict filter (`losses.gd2po_advantages`): mode, SNR threshold τ, ε of the SNR denominator."""

    mode: GD2POMode = GD2POMode.HARD
    tau: float = 0.2
    eps_snr: float = 1e-6

    def __post_init__(self):
        _check(0 <= self.tau <= 1, "algorithm.gd2po.tau", self.tau, "must be in [0, 1]")
        _check(self.eps_snr > 0, "algorithm.gd2po.eps_snr", self.eps_snr, "must be > 0")


@dataclasses.dataclass(frozen=True)
class CLIPOSection:
    """CLIPO contrastive head (arXiv:2603.10101): temperature τ, bonus scale λ (`lam`), head width (reference
    scripts: 512 GSM8K, 2048 MATH), head AdamW lr, and RL steps during which only the head trains."""

    tau: float = 0.05
    lam: float = 0.2
    head_dim: int = 512
    lr: float = 1e-3
    warmup_steps: int = 0

    def __post_init__(self):
        _check(self.tau > 0, "algorithm.clipo.tau", self.tau, "must be > 0")
        _check(self.lr > 0, "algorithm.clipo.lr", self.lr, "must be > 0")
        _check(self.lam >= 0, "algorithm.clipo.lam", self.lam, "must be >= 0")
        _check(self.head_dim >= 1, "algorithm.clipo.head_dim", self.head_dim, "must be >= 1")
        _check(self.warmup_steps >= 0, "algorithm.clipo.warmup_steps", self.warmup_steps, "must be >= 0")


@dataclasses.dataclass(frozen=True)
class DAPOSection:
    """DAPO dynamic sampling: resampling rounds per step (0 = off), and the rewards whose sum decides whether a
    group is kept (empty: every reward except the length shaping ones, i.e. the recipe's `acc`)."""

    max_tries: int = 8
    filter_rewards: tuple[str, ...] = ()

    def __post_init__(self):
        _check(self.max_tries >= 0, "algorithm.dapo.max_tries", self.max_tries, "must be >= 0")


@dataclasses.dataclass(frozen=True)
class SFTSection:
    """AFRL SFT-auxiliary loss: weight λ_SFT (`lam`) of the expert-row NLL."""

    lam: float = 0.1

    def __post_init__(self):
        _check(self.lam >= 0, "algorithm.sft.lam", self.lam, "must be >= 0")


@dataclasses.dataclass(frozen=True)
class ReinforcePPSection:
    """REINFORCE++ (`losses.reinforce_pp_advantages`): discount γ of the last-token reward per trained token
    (verl `algorithm.gamma`, default 1: every token's return is the reward)."""

    gamma: float = 1.0

    def __post_init__(self):
        _check(0 <= self.gamma <= 1, "algorithm.reinforce_pp.gamma", self.gamma, "must be in [0, 1]")


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


class Objective(str, enum.Enum):
    """The per-token policy objective of the update (`losses`): PPO/GRPO clip, GSPO, GSPO-token, CISPO, SAPO."""

    PPO_CLIP = "ppo_clip"
    GSPO = "gspo"
    GSPO_TOKEN = "gspo_token"
    CISPO = "cispo"
    SAPO = "sapo"


@dataclasses.dataclass(frozen=True)
class ObjectiveSection:
    """Which policy objective and its own settings. `ppo_clip` uses `algorithm.clip` (and ETR's elastic
    bounds); GSPO (arXiv:2507.18071) its sequence-ratio clip `gspo_low/high` (paper 3e-4 / 4e-4); CISPO
    (MiniMax-M1, arXiv:2506.13585) the IS-weight bounds `cispo_w_max` / `cispo_w_min`; SAPO (arXiv:2511.20347)
    the gate temperatures `sapo_tau_pos` / `sapo_tau_neg`.

    CISPO default: the paper's form, ŵ = clip(r, 1 − ε_low^IS, 1 + ε_high^IS) with ε_low^IS "large" (no lower
    bound: `cispo_w_min` null) and only ε_high^IS tuned (§3.1). The report prints no number for ε_high^IS, so
    `cispo_w_max` = 1 + 0.2 = 1.2 is verl's CISPO example of that form (`examples/cispo_trainer`:
    clip_ratio_low 10, clip_ratio_high 0.2). Other references: verl's plain default is the two-sided
    [0.8, 1.2]; TRL's cap is `epsilon_high` as an absolute weight, 0.2 when unset (REINFORCE scaled by 0.2),
    and 5 in its ScaleRL example (arXiv:2510.13786)."""

    name: Objective = Objective.PPO_CLIP
    gspo_low: float = 3e-4
    gspo_high: float = 4e-4
    cispo_w_max: float = 1.2
    cispo_w_min: float | None = None
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05

    def __post_init__(self):
        _check(0 <= self.gspo_low < 1, "algorithm.objective.gspo_low", self.gspo_low, "must be in [0, 1)")
        _check(self.gspo_high >= 0, "algorithm.objective.gspo_high", self.gspo_high, "must be >= 0")
        _check(self.cispo_w_max > 0, "algorithm.objective.cispo_w_max", self.cispo_w_max, "must be > 0")
        if self.cispo_w_min is not None:
            _check(0 <= self.cispo_w_min <= self.cispo_w_max, "algorithm.objective.cispo_w_min",
                   self.cispo_w_min, "must be in [0, cispo_w_max] or null")
        for name in ("sapo_tau_pos", "sapo_tau_neg"):
            _check(getattr(self, name) > 0, f"algorithm.objective.{name}", getattr(self, name), "must be > 0")


# The aggregation each policy objective's reference uses (`AlgorithmConfig.agg_mode` unset).
OBJECTIVE_AGG: dict[Objective, AggMode] = {
    Objective.PPO_CLIP: AggMode.TOKEN_MEAN,
    Objective.GSPO: AggMode.SEQ_MEAN_TOKEN_MEAN,
    Objective.GSPO_TOKEN: AggMode.SEQ_MEAN_TOKEN_MEAN,
    Objective.CISPO: AggMode.TOKEN_MEAN,
    Objective.SAPO: AggMode.SEQ_MEAN_TOKEN_MEAN,
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

    `name` is a key of `jaxrl.algorithms.ALGORITHMS` (built-ins: the `Algo` values). Each method's own
    settings live in its sub-section (`etr`, `gd2po`, `clipo`, `dapo`, `sft`, `gdpo`, `reinforce_pp`,
    `ppo`); `clip`
    and `kl` are shared. The flat keys of earlier versions (`etr_alpha`, `clipo_tau`, ...) are refused with
    their new place. `params` holds the hyper-parameters of a record that declares its own parameter class
    (`Algorithm.params`, e.g. a user's algorithm), checked against that class at load (`algorithm_params`).

    `agg_mode` left unset (null) resolves at load to the policy objective's reference aggregation
    (`OBJECTIVE_AGG`): token-mean for `ppo_clip` (verl's default) and `cispo` (the paper's 1/Σ|o_i|),
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
    etr: ETRSection = ETRSection()
    gdpo: GDPOSection = GDPOSection()
    gd2po: GD2POSection = GD2POSection()
    clipo: CLIPOSection = CLIPOSection()
    dapo: DAPOSection = DAPOSection()
    sft: SFTSection = SFTSection()
    reinforce_pp: ReinforcePPSection = ReinforcePPSection()
    ppo: PPOSection = PPOSection()
    objective: ObjectiveSection = ObjectiveSection()
    mismatch: MismatchSection = MismatchSection()
    distill: DistillSection = DistillSection()
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # the record's own (`algorithm_params`)

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "clip_low": "clip.low", "clip_high": "clip.high", "dual_clip": "clip.dual",
        "kl_beta": "kl.beta", "kl_kind": "kl.kind", "kl_in": "kl.where",
        "etr_alpha": "etr.alpha", "etr_beta": "etr.beta", "etr_adv_max": "etr.adv_max",
        "gd2po_mode": "gd2po.mode", "gd2po_tau": "gd2po.tau",
        "clipo_tau": "clipo.tau", "clipo_lambda": "clipo.lam", "clipo_head_dim": "clipo.head_dim",
        "clipo_lr": "clipo.lr", "clipo_warmup_steps": "clipo.warmup_steps",
        "sft_lambda": "sft.lam", "dynamic_sampling_max_tries": "dapo.max_tries",
    }

    def __post_init__(self):
        if self.agg_mode is None:  # resolved once here, so the trainer and the saved config see the mode
            object.__setattr__(self, "agg_mode", OBJECTIVE_AGG[self.objective.name])
        _check(self.adv_eps > 0, "algorithm.adv_eps", self.adv_eps, "must be > 0")
        _check(self.entropy_coef >= 0, "algorithm.entropy_coef", self.entropy_coef, "must be >= 0")
        for name in ("ppo_epochs", "mini_batches", "grad_accum"):
            _check(getattr(self, name) >= 1, f"algorithm.{name}", getattr(self, name), "must be >= 1")


def algorithm_params(params_cls: type | None, raw: Mapping[str, Any], name: str) -> Any:
    """`algorithm.params` as the algorithm record's parameter class (`Algorithm.params`): unknown keys, wrong
    types and the class's own checks fail as one-line ConfigErrors naming `algorithm.params.<key>`, at load.

    Args:
      params_cls: the record's dataclass of hyper-parameters; None when it declares none (then `raw` must be
        empty).
      raw: the config's mapping.
      name: `algorithm.name`, for the message.
    """
    if params_cls is None:
        _check(not raw, "algorithm.params", dict(raw), f"algorithm {name!r} declares no parameters")
        return None
    try:
        return from_dict(params_cls, dict(raw), "algorithm.params")
    except (TypeError, ValueError) as e:  # the class's own __post_init__ checks
        raise ConfigError(f"algorithm.params of {name!r}: {e}") from None
