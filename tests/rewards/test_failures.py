"""Failing rewards: `score` counts failed samples and keeps the first failure; `RewardFailureTracker` stops a
run whose reward fails on every sample for `max_failed_steps` consecutive steps."""

import math

import numpy as np
import pytest

from jaxrl import rewards
from jaxrl.config import RewardSpec
from jaxrl.errors import UserError


def _always_raises(prompts, completions):
    raise ZeroDivisionError("division by zero in my reward")


def _nan_unless_good(prompts, completions):
    return [1.0 if c == "good" else math.nan for c in completions]


def _none_for_all(prompts, completions):
    return [None] * len(completions)


def _resolved():
    return rewards.resolve([
        RewardSpec(name="crash", function=f"{__name__}:_always_raises"),
        RewardSpec(name="nan", function=f"{__name__}:_nan_unless_good", on_error="skip"),
        RewardSpec(name="fmt", type="format", params={"tags": ["answer"]}),
    ])


def test_score_info_counts_failures_per_reward():
    rewards_NK, info = rewards.score(_resolved(), ["p"] * 3, ["good", "bad", "<answer>1</answer>"])
    assert info.num_samples == 3 and info.errors == {"crash": 3, "nan": 2, "fmt": 0}
    assert info.metrics["reward/crash/errors"] == 3.0 and info.metrics["reward/nan/errors"] == 2.0
    np.testing.assert_array_equal(rewards_NK[:, 0], [0, 0, 0])  # on_error=zero
    assert rewards_NK[0, 1] == 1.0 and np.isnan(rewards_NK[1:, 1]).all()  # on_error=skip
    np.testing.assert_array_equal(rewards_NK[:, 2], [0, 0, 1])
    assert set(info.first_failure) == {"crash", "nan"}
    assert "Traceback" in info.first_failure["crash"]
    assert info.first_failure["crash"].splitlines()[-1] == "ZeroDivisionError: division by zero in my reward"
    assert info.first_failure["nan"] == "sample 1 returned nan"


def test_tracker_stops_after_max_failed_steps_consecutive_all_failed_steps():
    resolved, tracker = _resolved(), rewards.RewardFailureTracker(3)
    for _ in range(2):
        tracker.update(rewards.score(resolved, ["p"] * 2, ["bad", "bad"])[1])
    assert tracker.streaks == {"crash": 2, "nan": 2, "fmt": 0}
    with pytest.raises(rewards.RewardError) as e:
        tracker.update(rewards.score(resolved, ["p"] * 2, ["bad", "bad"])[1])
    assert str(e.value) == ("reward 'crash' failed on every sample for 3 consecutive steps "
                            "(train.max_failed_reward_steps=3); first error: ZeroDivisionError: division by zero "
                            "in my reward")
    assert isinstance(e.value, UserError)


def test_one_scored_sample_resets_the_count():
    resolved = rewards.resolve([RewardSpec(name="nan", function=f"{__name__}:_nan_unless_good")])
    tracker = rewards.RewardFailureTracker(2)
    tracker.update(rewards.score(resolved, ["p"] * 2, ["bad", "bad"])[1])
    tracker.update(rewards.score(resolved, ["p"] * 2, ["bad", "good"])[1])  # 1 of 2 scored: not all failed
    assert tracker.streaks == {"nan": 0}
    tracker.update(rewards.score(resolved, ["p"] * 2, ["bad", "bad"])[1])
    # DAPO: a step with several scoring rounds fails only when every round's every sample failed
    tracker.update(rewards.score(resolved, ["p"], ["bad"])[1], rewards.score(resolved, ["p"], ["good"])[1])
    assert tracker.streaks == {"nan": 0}
    tracker.update(rewards.score(resolved, ["p"], ["bad"])[1])
    with pytest.raises(rewards.RewardError, match=r"'nan' failed on every sample for 2 consecutive steps "
                                                  r"\(train\.max_failed_reward_steps=2\); first error: sample 0 "
                                                  r"returned nan"):
        tracker.update(rewards.score(resolved, ["p"], ["bad"])[1], rewards.score(resolved, ["p"], ["bad"])[1])


def test_tracker_reports_the_first_failure_of_the_streak():
    resolved = rewards.resolve([RewardSpec(name="none", function=f"{__name__}:_none_for_all")])
    tracker = rewards.RewardFailureTracker(1)
    with pytest.raises(rewards.RewardError, match=r"first error: sample 0 returned None$"):
        tracker.update(rewards.score(resolved, ["p"], ["x"])[1])


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_tracker_rejects_a_bad_limit(bad):
    with pytest.raises(UserError, match=r"train\.max_failed_reward_steps=.*must be an integer >= 1"):
        rewards.RewardFailureTracker(bad)
