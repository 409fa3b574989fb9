"""jaxrl.algorithms: one `Algorithm` record per RL method, and the registry that `algorithm.name` selects.

To add a method, write its advantage function (and, if it needs them, a shaping / resampling / extra-rows
stage, and a dataclass of its hyper-parameters), then register a record:

    ALGORITHMS["my_method"] = Algorithm("my_method", advantages=my_advantages, params=MyParams)

Nothing else changes: the RL step (`jaxrl.rl.step`) runs the record's stages in a fixed order. From a file of
your own, without editing the library: `algorithm.name: my_package.my_module:MY_METHOD` (or
`path/to/file.py:MY_METHOD`) names the record, and `resolve` registers it under that name at config load.
"""

from jaxrl._imports import import_attr, is_reference
from jaxrl.algorithms import estimators
from jaxrl.algorithms.base import (
    AdvantageFn,
    Advantages,
    AlgoSettings,
    Algorithm,
    Shaper,
    combined_reward,
    segment_advantages,
    sequence_advantages,
    task_reward,
    zero_std_group_frac,
)
from jaxrl.algorithms.clipo import CLIPOParams, ClipoHead, clipo_head
from jaxrl.algorithms.dapo import DAPOParams, dynamic_sampling, filter_columns, informative_groups
from jaxrl.algorithms.estimators import ETRParams, GD2POParams, GDPOParams, ReinforcePPParams
from jaxrl.algorithms.kl_reward import KLRewardPenalty
from jaxrl.algorithms.sft_aux import SFTAuxParams, expert_rows

ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm("grpo", estimators.grpo("group")),
    "dr_grpo": Algorithm("dr_grpo", estimators.grpo("none")),
    "dapo": Algorithm("dapo", estimators.grpo("group"), resample=dynamic_sampling, params=DAPOParams,
                      task_columns=filter_columns),
    "rloo": Algorithm("rloo", estimators.rloo, min_group=2),
    "gdpo": Algorithm("gdpo", estimators.gdpo, per_reward=True, params=GDPOParams),
    "gd2po": Algorithm("gd2po", estimators.gd2po, per_reward=True, params=GD2POParams),
    "etr": Algorithm("etr", estimators.etr, params=ETRParams),
    "clipo": Algorithm("clipo", estimators.grpo("group"), shaper=clipo_head, params=CLIPOParams),
    "reinforce_pp": Algorithm("reinforce_pp", estimators.reinforce_pp, params=ReinforcePPParams),
    "reinforce_pp_baseline": Algorithm("reinforce_pp_baseline", estimators.reinforce_pp_baseline),
    "ppo": Algorithm("ppo", estimators.outcome_rewards, critic=True),
    "sft_aux": Algorithm("sft_aux", estimators.grpo("group"), extra_rows=expert_rows, params=SFTAuxParams,
                         loss=lambda s: {"sft_lambda": s.params.lam}),
}



def resolve(name: str) -> Algorithm | None:
    """The record `algorithm.name` names: a registry key, or user code "module:attr" / "file.py:attr" holding
    an `Algorithm` record (imported once and registered under `name`, so every later lookup finds it); None
    for an unknown key. A reference that does not import or is not a record is a ConfigError."""
    if name not in ALGORITHMS and is_reference(name):
        ALGORITHMS[name] = import_attr(name, "algorithm.name", kind="Algorithm record",
                                       accept=lambda obj: isinstance(obj, Algorithm))
    return ALGORITHMS.get(name)


# Algorithms that are an advantage estimator and nothing else (no resampling, reward shaping or extra rows):
# the ones a multi-agent role may use instead of the run's (`multi_agent.estimators`).
ESTIMATOR_ONLY = tuple(name for name, a in ALGORITHMS.items()
                       if a.resample is None and a.shaper is None and a.extra_rows is None and not a.critic)

__all__ = [
    "ALGORITHMS",
    "resolve",
    "ESTIMATOR_ONLY",
    "AdvantageFn",
    "Advantages",
    "AlgoSettings",
    "Algorithm",
    "CLIPOParams",
    "ClipoHead",
    "DAPOParams",
    "ETRParams",
    "GD2POParams",
    "GDPOParams",
    "KLRewardPenalty",
    "ReinforcePPParams",
    "SFTAuxParams",
    "Shaper",
    "combined_reward",
    "dynamic_sampling",
    "estimators",
    "expert_rows",
    "filter_columns",
    "informative_groups",
    "segment_advantages",
    "sequence_advantages",
    "task_reward",
    "zero_std_group_frac",
]
