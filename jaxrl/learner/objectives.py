"""The per-token policy objectives of the update: one `PolicyObjective` record each, selected by
`algorithm.objective.name`, with its own hyper-parameters under `algorithm.objective.params`.

    ppo_clip    PPO / GRPO clip of the token ratio, with `algorithm.clip` (and ETR's per-sample bounds)
    gspo        GSPO (arXiv:2507.18071): the sequence ratio clipped to [1 - clip_low, 1 + clip_high]
    gspo_token  GSPO-token: the sequence ratio's value with per-token gradients
    cispo       CISPO (MiniMax-M1, arXiv:2506.13585): clipped, detached IS weights times log π
    sapo        SAPO (arXiv:2511.20347): soft sigmoid gates of temperature tau_pos / tau_neg

A record's function maps (logp_BT, batch, mask_BT, spec, **params) to (loss_BT, metrics), unaggregated; the
train step (`jaxrl.learner.train_step`) aggregates it with `algorithm.agg_mode`, whose unset value resolves at
load to the record's `agg` (its reference's aggregation). An objective of your own: a record in your file,
`algorithm.objective.name: path/to/file.py:RECORD` (registered at config load by `resolve`, like algorithms).

CISPO's default is the paper's form, ŵ = clip(r, 1 − ε_low^IS, 1 + ε_high^IS) with ε_low^IS "large" (no lower
bound: `w_min` null) and only ε_high^IS tuned (§3.1). The report prints no number for ε_high^IS, so `w_max` =
1 + 0.2 = 1.2 is verl's CISPO example of that form (`examples/cispo_trainer`: clip_ratio_low 10,
clip_ratio_high 0.2). Other references: verl's plain default is the two-sided [0.8, 1.2]; TRL's cap is
`epsilon_high` as an absolute weight, 0.2 when unset, and 5 in its ScaleRL example (arXiv:2510.13786).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxrl import losses
from jaxrl._checks import check as _check
from jaxrl._imports import import_attr, is_reference
from jaxrl.losses import AggMode

PARAMS_KEY = "algorithm.objective.params"


@dataclasses.dataclass(frozen=True)
class PolicyObjective:
    """One policy objective.

    Attributes:
      name: the `algorithm.objective.name` that selects it.
      fn: (logp_BT, batch, mask_BT, spec, **params) -> (loss_BT, metrics), per token, unaggregated; `batch` is
        the `TrainBatch` (old_logp_BT, adv_BT, clip bounds), `spec` the `LossSpec`.
      agg: its reference's aggregation, the default of `algorithm.agg_mode`.
      params: the dataclass of its hyper-parameters (every field with a default; the field names are `fn`'s
        keyword arguments), set under `algorithm.objective.params`; None: it takes none.
      clip_frac_key: its metric of the share of clipped tokens, logged as `clip_frac` (None: it clips none).
    """

    name: str
    fn: Callable[..., tuple[Any, dict]]
    agg: AggMode = AggMode.TOKEN_MEAN
    params: type | None = None
    clip_frac_key: str | None = "pg/clip_frac"


@dataclasses.dataclass(frozen=True)
class GSPOParams:
    """GSPO's sequence-ratio clip (paper: 3e-4 / 4e-4)."""

    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def __post_init__(self):
        _check(0 <= self.clip_low < 1, f"{PARAMS_KEY}.clip_low", self.clip_low, "must be in [0, 1)")
        _check(self.clip_high >= 0, f"{PARAMS_KEY}.clip_high", self.clip_high, "must be >= 0")


@dataclasses.dataclass(frozen=True)
class CISPOParams:
    """CISPO's IS-weight bounds: cap `w_max`, floor `w_min` (null: none, the paper's one-sided form)."""

    w_max: float = 1.2
    w_min: float | None = None

    def __post_init__(self):
        _check(self.w_max > 0, f"{PARAMS_KEY}.w_max", self.w_max, "must be > 0")
        if self.w_min is not None:
            _check(0 <= self.w_min <= self.w_max, f"{PARAMS_KEY}.w_min", self.w_min,
                   "must be in [0, w_max] or null")


@dataclasses.dataclass(frozen=True)
class SAPOParams:
    """SAPO's gate temperatures for positive and negative advantages."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self):
        for name in ("tau_pos", "tau_neg"):
            _check(getattr(self, name) > 0, f"{PARAMS_KEY}.{name}", getattr(self, name), "must be > 0")


def _ppo_clip(logp_BT, batch, m_BT, spec, **_):
    return losses.clipped_objective(logp_BT, batch.old_logp_BT, batch.adv_BT, m_BT, clip_low=batch.clip_low_B,
                                    clip_high=batch.clip_high_B, dual_clip=spec.dual_clip,
                                    ratio_level=spec.ratio_level)


def _wrap(fn, **fixed):
    """A `losses` objective of (logp, old_logp, adv, mask, **kwargs) as a record's `fn`."""

    def objective(logp_BT, batch, m_BT, spec, **kwargs):
        del spec
        return fn(logp_BT, batch.old_logp_BT, batch.adv_BT, m_BT, **fixed, **kwargs)

    return objective


OBJECTIVES: dict[str, PolicyObjective] = {
    "ppo_clip": PolicyObjective("ppo_clip", _ppo_clip, AggMode.TOKEN_MEAN),
    "gspo": PolicyObjective("gspo", _wrap(losses.gspo_objective, token_level=False), AggMode.SEQ_MEAN_TOKEN_MEAN,
                            GSPOParams),
    "gspo_token": PolicyObjective("gspo_token", _wrap(losses.gspo_objective, token_level=True),
                                  AggMode.SEQ_MEAN_TOKEN_MEAN, GSPOParams),
    "cispo": PolicyObjective("cispo", _wrap(losses.cispo_objective), AggMode.TOKEN_MEAN, CISPOParams,
                             "cispo/clip_frac"),
    "sapo": PolicyObjective("sapo", _wrap(losses.sapo_objective), AggMode.SEQ_MEAN_TOKEN_MEAN, SAPOParams,
                            None),  # soft gates: nothing is clipped
}


def resolve(name: str) -> PolicyObjective | None:
    """The record `algorithm.objective.name` names: a registry key, or user code "module:attr" /
    "file.py:attr" holding a `PolicyObjective` (imported once and registered under `name`); None for an
    unknown key."""
    if name not in OBJECTIVES and is_reference(name):
        OBJECTIVES[name] = import_attr(name, "algorithm.objective.name", kind="PolicyObjective record",
                                       accept=lambda obj: isinstance(obj, PolicyObjective))
    return OBJECTIVES.get(name)


def objective_kwargs(params) -> tuple[tuple[str, Any], ...]:
    """The record's parameters as `LossSpec.objective_kwargs` (sorted, hashable)."""
    return () if params is None else tuple(sorted(dataclasses.asdict(params).items()))
