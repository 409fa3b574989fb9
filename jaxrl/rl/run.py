"""The `Run`: everything resolved once for a run by `jaxrl.rl.setup.setup` (specs, host objects, jitted
functions and the three plug-ins: `Policy`, `Collector`, `UpdateSchedule`); nothing below setup reads the
experiment config. Also the small specs it holds and the error a run stops with after non-finite steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import optax

from jaxrl import rewards as rewards_lib
from jaxrl.algorithms import Algorithm, AlgoSettings, Shaper
from jaxrl.errors import UserError
from jaxrl.rl.ahead import Synchronous
from jaxrl.rl.collect import Collector
from jaxrl.rl.policy import Policy
from jaxrl.rl.update import UpdateSchedule
from jaxrl.sampling import SamplingSpec
from jaxrl.learner.train_step import LossSpec


class NonFiniteError(UserError):
    """Too many consecutive steps had a non-finite loss or gradient."""


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
    """PPO epochs x mini-batches over one rollout batch; `seed` orders the rows of each epoch."""

    ppo_epochs: int = 1
    mini_batches: int = 1
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class MismatchSpec:
    """Sampler/trainer log-prob mismatch correction (`losses.rollout_correction`); mode "off" only measures."""

    mode: str = "off"
    level: str = "token"
    lower: float | None = None
    upper: float | None = 2.0
    reject: str = "mask"  # MIS: "mask" (verl) or "zero_weight" (TRL), `losses.rollout_correction`

    @classmethod
    def from_config(cls, m) -> "MismatchSpec":
        """From the config's `algorithm.mismatch` section."""
        return cls(m.mode.value, m.level.value, m.lower, m.upper, m.reject.value)


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything resolved once for a run: specs, host objects and jitted functions (no config); frozen: a
    plug-in keeps its own state, the run's choices do not change after setup."""

    run_dir: Path
    mesh: Any
    rules: Any
    graphdef: Any
    hidden_dim: int
    tokenizer: Any
    tx: optax.GradientTransformation
    loss: LossSpec
    update: UpdateSpec
    sampling: SamplingSpec
    eval_sampling: SamplingSpec
    rewards: rewards_lib.Rewards  # resolved once (`jaxrl.rewards.resolve`)
    algorithm: Algorithm
    settings: AlgoSettings
    seed: int
    logprobs_from_sampler: bool
    mismatch: MismatchSpec
    state_sharding: Any
    step_fn: Any
    logprob_fn: Any  # (params, tokens_BL, mask_BL, T, group=1, packed=None) -> logp_BT
    collector: Collector  # single-turn, environment episodes or a multi-agent system (`jaxrl.rl.collect`)
    policy: Policy  # trained params -> sampling params, reference, a role's train view (`jaxrl.rl.policy`)
    schedule: UpdateSchedule  # joint, or phased by role segment (`jaxrl.rl.update`)
    shapers: list[Shaper] = dataclasses.field(default_factory=list)
    # stages on the assembled batch, in order: (batch, clock) -> (batch, metrics); on-policy distillation's
    # teacher (`jaxrl.rl.distill.Teacher`)
    batch_stages: list = dataclasses.field(default_factory=list)
    segment_estimators: tuple = ()  # per role segment: its own advantage estimator, None = the algorithm's
    # train.packing auto: (mini-batch) -> (mini-batch, packed where that saves work; metrics)
    # (`jaxrl.rl.packing.RLPacker`); None: padded rows
    packer: Any = None
    share_prompts: str = "auto"  # train.share_prompts: "auto" | "always" | "never" (`prompt_groups`)
    flops_per_token: Any = None  # context -> the update's model FLOPs per token (`step_time`); None: no MFU
    # where each step's rollout comes from: now (k = 0) or collected ahead, k versions behind (`jaxrl.rl.ahead`)
    feed: Any = dataclasses.field(default_factory=Synchronous)


def placed_shardings(tree, mesh) -> Any:
    """Each leaf's NamedSharding, replicated on `mesh` for a leaf not placed on it (optax's scalar count)."""
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(lambda x: x.sharding if isinstance(x.sharding, jax.sharding.NamedSharding) else rep, tree)
