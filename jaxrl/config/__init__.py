"""Typed experiment configuration: one frozen dataclass per section, composed into `ExperimentConfig`.

YAML files in `configs/` map 1:1 onto these dataclasses (levanter/draccus style). `load_config(path, overrides)`
reads the YAML with `yaml.safe_load`, applies dotted `--set a.b=c` overrides (values parsed with
`yaml.safe_load`) and builds the dataclasses; every unknown key, wrong type or invalid value raises
`jaxrl.errors.ConfigError` with one message naming the full dotted key (and, for a misspelt key, the closest
valid one). `dump_config` writes the resolved YAML, which loads back to an equal config.

Only `jaxrl/cli.py` and the run's setup read `ExperimentConfig`; everything below them takes small configs or
plain arguments (STYLE.md principle 13). The modules, one concern each:

* `io`: the generic YAML <-> dataclass machinery (also `jaxrl train-rm`'s config);
* `model`: `model:` and `tokenizer:`;
* `sources`: where rows come from: `data:`, `rollout:`, `rewards:`, `env:`, `multi_agent:`;
* `algorithm`: `algorithm:` (the shared sub-sections; a method's own hyper-parameters are `algorithm.params`);
* `training`: `optimizer:`, `checkpoint:`, `logging:`, `sft_warmup:`, `train:`;
* `experiment`: `ExperimentConfig` (the checks that span sections), `load_config`, `dump_config`, `save_config`.
"""

from jaxrl.config.algorithm import (  # noqa: F401 -- the algorithm section, re-exported
    Algo,
    AlgorithmConfig,
    ClipSection,
    DistillMode,
    DistillSection,
    KLSection,
    KLWhere,
    MismatchLevel,
    MismatchMode,
    MismatchSection,
    ObjectiveSection,
    PPOSection,
)
from jaxrl.config.experiment import (  # noqa: F401
    DEFAULT_CONFIG,
    WORLD_DEFAULTS,
    ExperimentConfig,
    config_dict,
    default_config_text,
    dump_config,
    load_config,
    save_config,
)
from jaxrl.config.model import DTYPES, NORMS, REMATS, ModelConfig, TokenizerConfig  # noqa: F401
from jaxrl.config.sources import DataConfig, EnvConfig, MultiAgentConfig, RewardSpec, RolloutConfig  # noqa: F401
from jaxrl.config.training import (  # noqa: F401
    SCHEDULES,
    TRACKERS,
    AsyncConfig,
    CheckpointConfig,
    LoggingConfig,
    MlflowConfig,
    OptimizerConfig,
    SFTWarmupConfig,
    TrainConfig,
    WandbConfig,
)
from jaxrl.models.lora import LoraConfig  # noqa: F401 -- model.lora's type
from jaxrl.sharding.mesh import MeshConfig  # noqa: F401 -- mesh's type
