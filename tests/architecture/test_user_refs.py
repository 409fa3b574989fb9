"""User code named in a config resolves through one helper (`jaxrl._imports.import_attr`, issue 26 item 4).

The same file defines an environment class, a multi-agent system class, a reward function, an algorithm
record and a policy objective record; each registry accepts "path/file.py:attr" (and "package.module:attr")
and fails with the same one-line shape, naming the config key.
"""

from __future__ import annotations

import re

import pytest

from jaxrl.errors import ConfigError

USER_FILE = '''
from jaxrl.algorithms import Algorithm, sequence_advantages
import numpy as np


class MyEnv:
    def __init__(self, tokenizer, *, size: int = 1):
        self.size = size

    def reset(self, record):
        return [1]

    def step(self, action):
        return None


class MySystem:
    def __init__(self, tokenizer, *, roles: int = 2):
        self.roles = roles


def my_reward(prompts, completions, **kw):
    return [1.0 for _ in completions]


def _adv(rewards_BR, weights_R, mask_BT, s):
    return sequence_advantages(np.zeros(rewards_BR.shape[0]), mask_BT, s)


MY_ALGO = Algorithm("my_algo", _adv)

from jaxrl.learner.objectives import PolicyObjective

MY_OBJECTIVE = PolicyObjective("my_objective", lambda logp_BT, batch, m_BT, spec: (0.0 * logp_BT, {}))
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_plugins.py"
    path.write_text(USER_FILE)
    return path


def test_every_registry_takes_a_file_reference(user_file):
    from jaxrl.algorithms import ALGORITHMS, resolve
    from jaxrl.envs import make_env
    from jaxrl.multi_agent import make_system
    from jaxrl.rewards import import_function

    assert make_env(f"{user_file}:MyEnv", {"size": 3})(None).size == 3
    assert make_system(f"{user_file}:MySystem", {"roles": 4}, None).roles == 4
    assert import_function(f"{user_file}:my_reward", "rewards[r].function")([], ["a", "b"]) == [1.0, 1.0]
    name = f"{user_file}:MY_ALGO"
    assert resolve(name).name == "my_algo" and ALGORITHMS[name] is resolve(name)  # registered once
    del ALGORITHMS[name]
    from jaxrl.learner import objectives

    name = f"{user_file}:MY_OBJECTIVE"
    record = objectives.resolve(name)
    assert record.name == "my_objective" and objectives.OBJECTIVES[name] is record is objectives.resolve(name)
    del objectives.OBJECTIVES[name]


@pytest.mark.parametrize("call, where", [
    (lambda ref: __import__("jaxrl.envs", fromlist=["make_env"]).make_env(ref), "env.name"),
    (lambda ref: __import__("jaxrl.multi_agent", fromlist=["make_system"]).make_system(ref, {}, None),
     "multi_agent.system"),
    (lambda ref: __import__("jaxrl.rewards", fromlist=["import_function"]).import_function(ref, "rewards[r]"),
     "rewards[r]"),
    (lambda ref: __import__("jaxrl.algorithms", fromlist=["resolve"]).resolve(ref), "algorithm.name"),
    (lambda ref: __import__("jaxrl.learner.objectives", fromlist=["resolve"]).resolve(ref),
     "algorithm.objective.name"),
])
def test_the_same_one_line_failures_everywhere(call, where, user_file):
    w, f = re.escape(where), re.escape(str(user_file))
    with pytest.raises(ConfigError, match=rf"^{w}='{f}x.py:A': no file '{f}x.py'$"):
        call(f"{user_file}x.py:A")
    with pytest.raises(ConfigError, match=rf"^{w}='no_such_mod_xyz:A': cannot import module 'no_such_mod_xyz' "
                                          r"\(ModuleNotFoundError"):
        call("no_such_mod_xyz:A")
    with pytest.raises(ConfigError, match=rf"^{w}='{f}:Missing': module '{f}' has no "):
        call(f"{user_file}:Missing")
