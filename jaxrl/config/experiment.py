"""`ExperimentConfig`, the sections composed, with the checks that span sections; loading, dumping, saving."""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Any

from jaxrl._checks import check as _check
from jaxrl.config.algorithm import AlgorithmConfig, KLWhere, algorithm_params
from jaxrl.config.io import dump_yaml_config, load_yaml_config, to_dict
from jaxrl.config.model import ModelConfig, TokenizerConfig
from jaxrl.config.sources import DataConfig, EnvConfig, MultiAgentConfig, RewardSpec, RolloutConfig
from jaxrl.config.training import CheckpointConfig, LoggingConfig, OptimizerConfig, SFTWarmupConfig, TrainConfig
from jaxrl.sharding.mesh import MeshConfig

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
        algorithm_params(algo.params, self.algorithm.params, algo.name)  # its own hyper-parameters, checked
        _check(not self.algorithm.ppo.critic_lora or self.model.lora is not None, "algorithm.ppo.critic_lora",
               True, "a LoRA critic sits on the LoRA policy's frozen base: set model.lora, or critic_lora: false")
        if self.multi_agent is not None and self.multi_agent.estimators:
            self._check_role_estimators(algo)
        if self.train.async_.partial_rollouts:
            self._check_partial_rollouts(algo)
        if algo.per_reward and self.algorithm.kl.beta > 0:
            _check(self.algorithm.kl.where is KLWhere.LOSS, "algorithm.kl.where", self.algorithm.kl.where.value,
                   f"{algo.name} normalises each reward column within its group, which would erase β of a KL "
                   "penalty in the reward; use kl.where: loss (as its reference implementations do)")
        # Every algorithm here but those with a critic (PPO: GAE, one sample per prompt is enough) normalises
        # rewards within a group of samples of the same prompt.
        slots, rows = self.rollout.engine.slots, self.data.prompts_per_step * self.rollout.group_size
        _check(self.rollout.engine.kind == "static" or self.multi_agent is None,
               "rollout.engine.kind", self.rollout.engine.kind, "must be 'static' with multi_agent: (a "
               "system's role turns decode with the turn decoder, jaxrl.sampling.multiturn; env: episodes "
               "may use the continuous engine)")
        _check(slots is None or slots <= rows, "rollout.engine.slots", slots,
               f"must be <= the rows of a step (data.prompts_per_step x rollout.group_size = {rows})")
        _check(self.rollout.group_size >= 2 or algo.critic, "rollout.group_size", self.rollout.group_size,
               "group-relative algorithms need group_size >= 2")
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

    def _check_partial_rollouts(self, algo) -> None:
        """`train.async.partial_rollouts`: single-turn completions (`jaxrl.rl.partial` continues a sampler's
        rows, not episodes or role turns), under an algorithm that draws no groups after the step began."""
        from jaxrl.algorithms import ALGORITHMS

        key = "train.async.partial_rollouts"
        where = "env" if self.env is not None else "multi_agent" if self.multi_agent is not None else None
        _check(where is None, key, True, f"continues single-turn completions only; remove the {where} section or "
               "set partial_rollouts: false")
        ok = [a.name for a in ALGORITHMS.values() if a.resample is None]
        _check(algo.resample is None, key, True,
               f"algorithm.name={algo.name!r} resamples groups during the step (DAPO dynamic sampling), which "
               f"needs whole groups sampled by one policy version; use an algorithm without resampling "
               f"({', '.join(ok)}) or partial_rollouts: false")

    def _check_role_estimators(self, algo) -> None:
        """`multi_agent.estimators`: estimator-only algorithms, under a run algorithm without group-wide
        stages, and no per-reward normalisation of a KL penalty in the reward. Which roles exist and are
        trained, and their group sizes, are the system's (checked at setup)."""
        from jaxrl.algorithms import ALGORITHMS, ESTIMATOR_ONLY

        _check(algo.name in ESTIMATOR_ONLY, "algorithm.name", algo.name,
               f"multi_agent.estimators gives roles their own estimator, which needs a run algorithm without "
               f"resampling, reward shaping, extra rows or a critic: {', '.join(ESTIMATOR_ONLY)}")
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
