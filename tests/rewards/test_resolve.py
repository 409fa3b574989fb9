"""`rewards.resolve`: every spec mistake is one ConfigError at setup; `score` calls each reward with its own
params and fields, and never re-resolves a `Rewards`."""

import dataclasses
import sys

import numpy as np
import pytest

from jaxrl import rewards
from jaxrl.config import RewardSpec
from jaxrl.errors import ConfigError
from jaxrl.rewards import specs as specs_mod


def _named_only(prompts, completions, *, answer, scale: float = 1.0):
    return [scale * float(a) for a in answer]


def _takes_all(prompts, completions, *, offset: int = 0, **fields):
    return [float(len(fields) + offset)] * len(completions)


def _required_param(prompts, completions, *, answer, threshold: float):
    return [float(float(a) > threshold) for a in answer]


def _one_positional(prompts):
    return [0.0] * len(prompts)


def _spec(**kw):
    return RewardSpec(**{"name": "r", **kw})


@pytest.mark.parametrize(
    "spec, message",
    [
        (_spec(type="math_answer", params={"tag_only": True}),
         "rewards[r].params.tag_only: unknown param of the 'math_answer' reward; did you mean 'tags_only'? "
         "params allowed: use_math_verify, tags_only"),
        (_spec(type="length"), "rewards[r].params.target: required by the 'length' reward and not given"),
        (_spec(type="length", params={"target": "8"}), "rewards[r].params.target='8': must be int"),
        (_spec(type="math_answer", params={"tags_only": "yes"}),
         "rewards[r].params.tags_only='yes': must be bool"),
        (_spec(type="length", params={"target": 0}), "rewards[r].params.target=0: must be >= 1"),
        (_spec(type="overlong", params={"max_len": 4, "buffer": 8}),
         "rewards[r].params.buffer=8: must be in (0, params.max_len=4]"),
        (_spec(type="math_answer", params={"answer": "1"}),
         "rewards[r].params.answer: is a per-sample field of the 'math_answer' reward"),
        (_spec(type="format"), "rewards[r].params: the format reward needs pattern"),
        (_spec(type="format", params={"pattern": "(a"}), "rewards[r].params.pattern='(a': not a valid regex"),
        (_spec(type="model", params={"checkpoint": "/no/such/rm"}),
         "rewards[r].params.checkpoint='/no/such/rm': does not exist"),
        (_spec(type="pairwise", params={"judge": "no_such_judge_mod:f", "group_size": 4}),
         "rewards[r].params.judge='no_such_judge_mod:f': cannot import module 'no_such_judge_mod'"),
        (_spec(type="pairwise", params={"judge": f"{__name__}:_named_only", "group_size": 1}),
         "rewards[r].params.group_size=1: must be >= 2"),
        (_spec(type="mathh"), "rewards[r].type='mathh': allowed values are 'math_answer'"),
        (_spec(function="no_such_reward_mod:f"), "rewards[r].function='no_such_reward_mod:f': cannot import"),
        (_spec(function=f"{__name__}:nope"), f"module '{__name__}' has no function 'nope'"),
        (_spec(function=f"{__name__}:_named_only", params={"scael": 2.0}),
         f"rewards[r].params.scael: unknown param of '{__name__}:_named_only'; did you mean "
         "'scale'? params allowed: answer, scale"),
        # **kwargs receives the per-sample fields only: a param must still be a named parameter
        (_spec(function=f"{__name__}:_takes_all", params={"ofset": 1}),
         f"rewards[r].params.ofset: unknown param of '{__name__}:_takes_all'; did you mean "
         "'offset'?"),
        (_spec(function=f"{__name__}:_named_only", params={"scale": "2"}),
         "rewards[r].params.scale='2': must be float"),
        (_spec(function=f"{__name__}:_one_positional"), "must take (prompts, completions, **fields)"),
    ],
)
def test_resolve_rejects_each_mistake_in_one_line(spec, message):
    with pytest.raises(ConfigError) as e:
        rewards.resolve([spec])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_resolve_checks_required_fields_when_the_data_fields_are_known():
    spec = _spec(function=f"{__name__}:_required_param")
    rewards.resolve([spec])  # fields unknown: `threshold` may be a per-sample field
    with pytest.raises(ConfigError, match=r"rewards\[r\]\.params\.threshold: .* needs this param"):
        rewards.resolve([spec], fields=["answer", "completion_length"])
    want = r"rewards\[a\]: the 'math_answer' reward needs the per-sample field 'answer'; the data has "
    with pytest.raises(ConfigError, match=want + "the fields completion_length"):
        rewards.resolve([RewardSpec(name="a", type="math_answer")], fields=["completion_length"])
    got = rewards.resolve([dataclasses.replace(spec, params={"threshold": 1.5})], fields=["answer"])
    assert got.rewards[0].required_fields == {"answer"}


def test_unimportable_user_module_is_a_config_error(tmp_path, monkeypatch):
    (tmp_path / "broken_reward_mod.py").write_text("raise RuntimeError('top-level failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"rewards\[r\]\.function='broken_reward_mod:f': cannot import "
                                          r"module 'broken_reward_mod' \(RuntimeError: top-level failure\)"):
        rewards.resolve([_spec(function="broken_reward_mod:f")])


def test_resolved_rewards_hold_names_weights_and_modes():
    got = rewards.resolve([
        RewardSpec(name="a", type="math_answer", weight=2.0, params={"tags_only": True}),
        RewardSpec(name="f", type="format", weight=0.5, on_error="skip", params={"tags": ["answer"]}),
    ])
    assert got.names == ("a", "f") and got.on_error == ("zero", "skip") and len(got) == 2
    np.testing.assert_array_equal(got.weights_R, np.float32([2.0, 0.5]))
    assert got.weights_R.dtype == np.float32 and dict(got.rewards[0].params) == {"tags_only": True}
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.rewards = ()
    with pytest.raises(TypeError):
        got.rewards[0].params["tags_only"] = False
    assert rewards.resolve(got) is got
    with pytest.raises(ConfigError, match=r"rewards\[a\]: reward names must be unique"):
        rewards.resolve([RewardSpec(name="a", type="exact_answer")] * 2)


def test_score_passes_each_reward_its_params_and_only_its_fields(monkeypatch):
    calls = []
    real = specs_mod.import_function
    monkeypatch.setattr(specs_mod, "import_function", lambda *a: calls.append(a) or real(*a))
    resolved = rewards.resolve([
        RewardSpec(name="named", function=f"{__name__}:_named_only", params={"scale": 3.0}),
        RewardSpec(name="all", function=f"{__name__}:_takes_all", params={"offset": 10}),
        RewardSpec(name="len", type="length", params={"target": 2}),
    ])
    fields = {"answer": ["1", "2"], "task": ["t", "t"], "completion_length": [2, 4]}
    for _ in range(3):
        rewards_BR, info = rewards.score(resolved, ["p", "p"], ["x", "y"], fields)
    assert len(calls) == 2  # imported once, at resolve
    # _named_only gets `answer` only; _takes_all gets all 3 fields (+10); length: -(4-2)/2 for row 2
    np.testing.assert_array_equal(rewards_BR, np.float32([[3, 13, 0], [6, 13, -1]]))
    assert info.errors == {"named": 0, "all": 0, "len": 0}
    with pytest.raises(ConfigError, match=r"rewards\[len\] needs the per-sample field 'completion_length'; "
                                          r"the data has answer, task"):
        rewards.score(resolved, ["p"], ["x"], {"answer": ["1"], "task": ["t"]})


def test_math_answer_is_symbolic():
    resolved = rewards.resolve([RewardSpec(name="m", type="math_answer")])
    rewards_BR, _ = rewards.score(resolved, ["p"] * 3,
                                  ["<answer>2x+x^2</answer>", "\\boxed{x^2+2x}", "<answer>x^2+x</answer>"],
                                  {"answer": ["x^2+2x"] * 3})
    np.testing.assert_array_equal(rewards_BR[:, 0], [1.0, 1.0, 0.0])


def test_without_math_verify_math_answer_refuses_to_run(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    want = r"rewards\[m\]\.params\.use_math_verify=True: math-verify cannot be imported .*pip install "
    with pytest.raises(ConfigError, match=want + r"'math-verify\[antlr4_13_2\]==0.9.0'"):
        rewards.resolve([RewardSpec(name="m", type="math_answer")])
    with pytest.raises(rewards.MathVerifyMissing):
        rewards.math_equal("x^2+2x", "2x+x^2")
    # numbers never need it, and opting out explicitly is allowed
    assert rewards.math_equal("0.5", "1/2")
    rewards.resolve([RewardSpec(name="m", type="math_answer", params={"use_math_verify": False})])
