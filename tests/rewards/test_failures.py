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
    rewards_BR, info = rewards.score(_resolved(), ["p"] * 3, ["good", "bad", "<answer>1</answer>"])
    assert info.num_samples == 3 and info.errors == {"crash": 3, "nan": 2, "fmt": 0}
    assert info.metrics["reward/crash/errors"] == 3.0 and info.metrics["reward/nan/errors"] == 2.0
    np.testing.assert_array_equal(rewards_BR[:, 0], [0, 0, 0])  # on_error=zero
    assert rewards_BR[0, 1] == 1.0 and np.isnan(rewards_BR[1:, 1]).all()  # on_error=skip
    np.testing.assert_array_equal(rewards_BR[:, 2], [0, 0, 1])
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


# Judges and reward models are rewards for the guard too (issue 30, item 3): a judge that fails on every pair,
# a proxy judge that never answers, and NaN scores of a reward model fail their samples instead of scoring 0.

def _judge_raises(prompt, a, b):
    raise ConnectionError("judge server down")


def _judge_nan(prompt, a, b):
    return math.nan


def _judge_by_length(prompt, a, b):
    return float(len(a) - len(b))


def _proxy_raises(question, response_1, response_2, rubric):
    raise ConnectionError("proxy server down")


@pytest.mark.parametrize("judge", ["_judge_raises", "_judge_nan"])
def test_a_pairwise_judge_failing_on_every_pair_trips_the_guard(judge):
    resolved = rewards.resolve([RewardSpec(name="judge", type="pairwise",
                                           params={"judge": f"{__name__}:{judge}", "group_size": 2})])
    tracker = rewards.RewardFailureTracker(3)
    for _ in range(2):
        rewards_BR, info = rewards.score(resolved, ["p", "p", "q", "q"], ["a", "bb", "c", "dd"])
        assert info.errors == {"judge": 4} and (rewards_BR == 0).all()  # on_error=zero, but counted
        tracker.update(info)
    with pytest.raises(rewards.RewardError, match=r"reward 'judge' failed on every sample for 3 consecutive "
                                                  r"steps .*first error: sample 0 returned None"):
        tracker.update(rewards.score(resolved, ["p", "p", "q", "q"], ["a", "bb", "c", "dd"])[1])


def test_a_judged_group_still_scores_beside_a_failed_one():
    params = {"judge": f"{__name__}:_judge_by_length", "group_size": 2}
    resolved = rewards.resolve([RewardSpec(name="judge", type="pairwise", on_error="skip", params=params)])
    rewards_BR, info = rewards.score(resolved, ["p", "p"], ["a", "bbb"])
    np.testing.assert_allclose(rewards_BR[:, 0], [-2.0, 2.0])
    assert info.errors == {"judge": 0}


def test_a_proxy_judge_that_never_answers_fails_the_samples():
    from jaxrl.rewards.judges.proxy_grm import proxy_grm_score

    spec = RewardSpec(name="grm", type="proxy_grm", params={"proxy": f"{__name__}:_proxy_raises"})
    fields = {"answer": ["1", "2"], "question": ["q", "q"], "response_1": ["a", "a"],
              "response_2": ["b", "b"]}
    completions = ["<rubric>r</rubric><eval>e</eval><answer>1</answer>"] * 2
    rewards_BR, info = rewards.score(rewards.resolve([spec]), ["p", "p"], completions, fields)
    assert info.errors == {"grm": 2} and (rewards_BR == 0).all()
    assert "proxy judge failed on all 2 samples; first error: ConnectionError: proxy server down" in \
        info.first_failure["grm"]
    # one answered sample keeps the reference's r_proxy = 0 for the others
    replies = iter(["<answer>1</answer>", None])

    def flaky(question, response_1, response_2, rubric):
        reply = next(replies)
        if reply is None:
            raise ConnectionError("timeout")
        return reply

    got = proxy_grm_score(["p", "p"], completions, fields["answer"], fields["question"], fields["response_1"],
                          fields["response_2"], proxy=flaky)
    assert all(math.isfinite(x) for x in got)


def test_nan_scores_of_a_reward_model_fail_their_samples(monkeypatch, tmp_path):
    import jax.numpy as jnp

    from jaxrl.rewards.judges import model_reward as mr
    from jaxrl.io.tokenizer import builtin_tokenizer

    tok = builtin_tokenizer()
    scores = {"good": 1.0, "bad": math.nan}

    def fake_load(checkpoint, dtype):
        # the scorer reads back which completion a row holds from its length (good: 4 chars, bad: 3)
        def scorer(state, tokens_BL):
            lengths = (tokens_BL != tok.pad_token_id).sum(-1)
            return jnp.where(lengths == lengths.max(), scores["good"], scores["bad"])
        return None, tok, scorer

    monkeypatch.setattr(mr, "_load", fake_load)
    got = mr.model_reward(["p", "p"], ["good", "bad"], checkpoint=str(tmp_path), batch_size=2)
    assert got[0] == 1.0 and got[1] is None
    # evpv's PRM: a NaN step score fails the sample instead of counting as a wrong step (-1)
    spec = RewardSpec(name="evpv", type="evpv", params={"prm": {"checkpoint": str(tmp_path)}})
    rewards_BR, info = rewards.score(rewards.resolve([spec]), ["p", "p"], ["good", "bad"])
    assert info.errors == {"evpv": 1} and info.first_failure["evpv"] == "sample 1 returned None"
