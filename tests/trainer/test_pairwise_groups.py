"""A pairwise judge's groups are the rollout's groups and sit on one host: both checked before any model is
built (config: group_size; setup: prompts per step divisible by the processes)."""

import pytest

from jaxrl.config import load_config
from jaxrl.errors import ConfigError
from jaxrl.rl.setup import _check_whole_groups_per_host

PAIRWISE = "rewards=[{name: judge, type: pairwise, params: {judge: 'json:dumps', group_size: %d}}]"


def test_pairwise_group_size_must_equal_the_rollout_group_size():
    with pytest.raises(ConfigError, match=r"rewards\[judge\]\.params\.group_size=3: must equal "
                                          r"rollout\.group_size=4"):
        load_config(overrides=["rollout.group_size=4", PAIRWISE % 3])
    assert load_config(overrides=["rollout.group_size=4", PAIRWISE % 4]).rewards[0].params["group_size"] == 4


def test_pairwise_needs_whole_groups_on_each_host():
    cfg = load_config(overrides=["rollout.group_size=2", "data.prompts_per_step=6", PAIRWISE % 2])
    _check_whole_groups_per_host(cfg, 2)  # 3 prompts per host
    _check_whole_groups_per_host(cfg, 3)
    with pytest.raises(ConfigError, match="data.prompts_per_step=6: must be divisible by the 4 processes"):
        _check_whole_groups_per_host(cfg, 4)
    plain = load_config(overrides=["rollout.group_size=2", "data.prompts_per_step=6"])
    _check_whole_groups_per_host(plain, 4)  # group statistics are global: only a judge needs whole groups
