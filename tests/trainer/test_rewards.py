"""Reward functions on hand-made cases, failure accounting in `score`, and countdown safety."""

import math
import threading

import numpy as np
import pytest

from jaxrl.config import RewardSpec
from jaxrl.errors import ConfigError, UserError
from jaxrl.rewards import (
    countdown,
    evaluate,
    exact_answer,
    extract_answer,
    format_reward,
    length_penalty,
    math_answer,
    math_equal,
    overlong_penalty,
    parse_number,
    resolve,
    score,
)
from jaxrl.rewards.countdown import InvalidExpression


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is <answer>42</answer>.", "42"),
        ("<answer>1</answer> then <answer> 7 </answer>", "7"),
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("nested \\boxed{a_{1}+b} end", "a_{1}+b"),
        ("unbalanced \\boxed{3", "3"),  # no boxed answer -> falls through to the last number
        ("steps...\n#### 1,000\nextra", "1,000"),
        ("a 3 b -5.5.", "-5.5"),
        ("no digits here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_tags_only_rewards_ignore_untagged_answers():
    completions = ["The answer is 7.", "<answer>7</answer>", "<answer>6</answer> so 7",
                   "7 <answer> 7 </answer>"]
    assert extract_answer(completions[0], tags_only=True) is None
    assert extract_answer(completions[2], tags_only=True) == "6"
    refs = ["7"] * 4
    assert math_answer([""] * 4, completions, answer=refs, tags_only=True) == [0.0, 1.0, 0.0, 1.0]
    assert exact_answer([""] * 4, completions, answer=refs, tags_only=True) == [0.0, 1.0, 0.0, 1.0]
    # the default still falls back to the last number in the text
    assert math_answer([""] * 4, completions, answer=refs) == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "text, value",
    [
        ("-12", -12),
        ("1,000", 1000),
        ("0.25", 0.25),
        ("3/4", 0.75),
        ("\\frac{3}{4}", 0.75),
        ("\\dfrac{-1}{2}", -0.5),
        ("$7$", 7),
        ("50%", 0.5),
        ("12.", 12),
        ("1,00", None),
        ("x+1", None),
        ("1/0", None),
    ],
)
def test_parse_number(text, value):
    got = parse_number(text)
    assert (got is None) if value is None else float(got) == value


def test_math_equal_numeric_and_symbolic():
    assert math_equal("0.5", "\\frac{1}{2}")
    assert math_equal("1000", "1,000")
    assert not math_equal("3", "4")
    assert math_equal("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}")  # math-verify (a core dependency)
    assert not math_equal("\\sqrt{2}/2", "\\frac{\\sqrt{3}}{2}")
    assert not math_equal("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", use_math_verify=False)


def test_math_equal_off_main_thread_uses_math_verify_without_timeouts():
    # math-verify's signal.alarm timeouts only work on the main thread; elsewhere it runs without them
    # (no silent fall back to string matching).
    out = {}
    t = threading.Thread(
        target=lambda: out.update(
            a=math_equal("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"), b=math_equal("0.5", "1/2"),
            c=math_equal("x^2+2x", "2x+x^2"), d=math_equal("\\sqrt{2}/2", "\\frac{\\sqrt{3}}{2}"),
        )
    )
    t.start()
    t.join()
    assert out == {"a": True, "b": True, "c": True, "d": False}


def test_math_and_exact_answer():
    completions = [
        "<answer>81</answer>",
        "it is \\boxed{81.0}",
        "#### 80",
        "no idea",
        "<answer>eighty-one</answer>",
    ]
    answers = ["81", "81", "81", "81", "#### 81"]
    assert math_answer([""] * 5, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert exact_answer([""] * 5, completions, answer=answers) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert exact_answer([""], ["<answer> Paris </answer>"], answer=["paris"]) == [1.0]


def test_math_answer_does_not_reward_the_question_copied_as_an_expression():
    """SmolLM2 on reasoning-gym arithmetic learned to answer "Calculate -4 + -4 * 4." with the expression
    itself, which math-verify evaluates to the reference. With a numeric reference the answer must be a
    number (`literal`, the default); `literal: false` keeps math-verify's evaluation; a reference that is not
    a number is still compared by math-verify."""
    copied = ["<answer>-4 + -4 * 4</answer>", "<answer>-20</answer>", "<answer>-20.0</answer>",
              "<answer>\\frac{-40}{2}</answer>"]
    assert math_answer([""] * 4, copied, answer=["-20"] * 4) == [0.0, 1.0, 1.0, 1.0]
    assert math_answer([""] * 4, copied, answer=["-20"] * 4, literal=False) == [1.0, 1.0, 1.0, 1.0]
    assert math_answer([""], ["<answer>x^2 + 2x + 1</answer>"], answer=["(x+1)^2"]) == [1.0]


def test_format_reward():
    c = [
        "<think>x</think><answer>1</answer>",
        "<answer>1</answer><answer>2</answer>",
        "1",
        " <answer>7</answer> ",
    ]
    assert format_reward([""] * 4, c, tags=["answer"]) == [1.0, 0.0, 0.0, 1.0]
    assert format_reward([""] * 4, c, pattern=r"<answer>\d+</answer>") == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="pattern"):
        format_reward([""], ["x"])


def test_length_and_overlong_penalties():
    lengths = [0, 4, 6, 8, 10, 12]
    # L_max=10, L_buf=4, κ=2: no penalty up to 6, then -(L-6)/4·2, reaching -κ at 10 and (DAPO eq. 13, spec
    # 1.5, jaxrl.losses.overlong_penalty) not clamped beyond: -(12-6)/4·2 = -3.
    got = overlong_penalty([""] * 6, [""] * 6, completion_length=lengths, max_len=10, buffer=4, factor=2.0)
    np.testing.assert_allclose(got, [0, 0, 0, -1.0, -2.0, -3.0])
    assert length_penalty([""] * 3, [""] * 3, completion_length=[3, 5, 9], target=5, coef=0.5) == [0, 0, -0.4]


@pytest.mark.parametrize(
    "expr, value, used",
    [
        ("(3 + 5) * 2", 16, [3, 5, 2]),
        ("7 / 2", 3.5, [7, 2]),
        ("10-2-3", 5, [10, 2, 3]),
    ],
)
def test_countdown_evaluate(expr, value, used):
    v, u = evaluate(expr)
    assert float(v) == value and u == used


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('echo hi')",
        "2**100000000",
        "-3 + 5",
        "1.5 * 2",
        "abs(3)",
        "3 +",
        "1 / (2 - 2)",
        "(" * 300 + "1" + ")" * 300,
    ],
)
def test_countdown_rejects_unsafe_or_invalid(expr):
    with pytest.raises(InvalidExpression):
        evaluate(expr)


def test_countdown_reward():
    completions = [
        "<answer>(3 + 5) * 2</answer>",
        "<answer>3 * 5 + 2</answer>",
        "<answer>(3 + 5) * 2 * 1</answer>",
        "(5 + 3) * 2 = 16",
        "<answer>import os</answer>",
        "<answer>(3+3)*2</answer>",
    ]
    n = len(completions)
    got = countdown([""] * n, completions, numbers=[[2, 3, 5]] * n, target=[16] * n, format_score=0.1)
    assert got == [1.0, 0.1, 0.1, 1.0, 0.0, 0.1]


def _raises_on_b(prompts, completions, **fields):
    if "b" in completions:
        raise RuntimeError("boom")
    return [1.0] * len(completions)


def _bad_values(prompts, completions, **fields):
    return [None, float("nan"), float("inf"), "x", 2.5][: len(completions)]


def _wrong_length(prompts, completions, **fields):
    return [1.0]


def _scaled(prompts, completions, *, scale, answer, **fields):
    return [scale * float(a) for a in answer]


def test_score_counts_and_treats_errors():
    specs = [
        RewardSpec(name="crash", function=f"{__name__}:_raises_on_b", on_error="zero"),
        RewardSpec(name="bad", function=f"{__name__}:_bad_values", on_error="skip"),
        RewardSpec(name="scaled", function=f"{__name__}:_scaled", params={"scale": 2.0}, weight=0.5),
        RewardSpec(name="fmt", type="format", params={"tags": ["answer"]}),
    ]
    completions = ["a", "b", "<answer>c</answer>", "d", "e"]
    rewards_BR, info = score(resolve(specs), ["p"] * 5, completions, {"answer": ["1", "2", "3", "4", "5"]})
    assert rewards_BR.dtype == np.float32 and rewards_BR.shape == (5, 4)
    np.testing.assert_array_equal(rewards_BR[:, 0], [1, 0, 1, 1, 1])
    assert np.isnan(rewards_BR[:4, 1]).all() and rewards_BR[4, 1] == 2.5
    np.testing.assert_array_equal(rewards_BR[:, 2], [2, 4, 6, 8, 10])
    np.testing.assert_array_equal(rewards_BR[:, 3], [0, 0, 1, 0, 0])
    assert info.errors == {"crash": 1, "bad": 4, "scaled": 0, "fmt": 0}
    assert info.names == ("crash", "bad", "scaled", "fmt")
    np.testing.assert_array_equal(info.weights_R, [1, 1, 0.5, 1])
    assert info.metrics["reward/bad/mean"] == 2.5 and info.metrics["reward/crash/errors"] == 1
    assert math.isclose(info.metrics["reward/crash/mean"], 0.8, rel_tol=1e-6)
    assert info.num_samples == 5 and set(info.first_failure) == {"crash", "bad"}
    assert info.first_failure["crash"].strip().splitlines()[-1] == "RuntimeError: boom"
    assert info.first_failure["bad"] == "sample 0 returned None"


def test_score_rejects_wrong_length_and_bad_specs():
    with pytest.raises(UserError, match="'short' returned 1 scores for 2"):
        short = resolve([RewardSpec(name="short", function=f"{__name__}:_wrong_length")])
        score(short, ["p", "p"], ["a", "b"])
    with pytest.raises(ConfigError, match=r"rewards\[x\].function='nosuchmod_xyz:f'"):
        resolve([RewardSpec(name="x", function="nosuchmod_xyz:f")])
    with pytest.raises(ConfigError, match=r"has no function 'nope'"):
        resolve([RewardSpec(name="x", function=f"{__name__}:nope")])
    with pytest.raises(ConfigError, match=r"rewards\[x\].type='mathh'"):
        resolve([RewardSpec(name="x", type="mathh")])
    fmt = resolve([RewardSpec(name="f", type="format", params={"tags": ["a"]})])
    with pytest.raises(ValueError, match="field lengths"):
        score(fmt, ["p"], ["a"], {"answer": [1, 2]})
    # the old call with specs still works (resolved on the fly)
    rewards_BR, _ = score([RewardSpec(name="f", type="format", params={"tags": ["a"]})], ["p"], ["<a>1</a>"])
    assert rewards_BR.tolist() == [[1.0]]


def test_reasoning_gym_reward_uses_the_task_scorer():
    pytest.importorskip("reasoning_gym")
    from jaxrl.data import load_records

    recs = load_records("reasoning_gym:countdown", 3, 0)
    assert all(isinstance(r["numbers"], list) and isinstance(r["target"], int) for r in recs)
    specs = [RewardSpec(name="gym", type="reasoning_gym"), RewardSpec(name="cd", type="countdown")]
    completions = [f"<answer>{recs[0]['answer']}</answer>", "<answer>1 + 1</answer>", "no answer"]
    fields = {k: [r[k] for r in recs] for k in ("answer", "task", "metadata", "numbers", "target")}
    rewards_BR, info = score(specs, [r["prompt"] for r in recs], completions, fields)
    # reasoning-gym countdown: 1.0 correct, 0.05 for a wrong expression; ours: 1.0 / 0.0
    np.testing.assert_allclose(rewards_BR[:2], [[1.0, 1.0], [0.05, 0.0]])
    assert rewards_BR[2, 1] == 0.0 and info.errors == {"gym": 0, "cd": 0}


def _bools(prompts, completions, **fields):
    return [c == "yes" for c in completions]


def test_score_accepts_bools_and_numpy_fields():
    spec = RewardSpec(name="b", function=f"{__name__}:_bools")
    rewards_BR, info = score([spec], ["p", "p"], ["yes", "no"], {"answer": np.array([1, 2])})
    np.testing.assert_array_equal(rewards_BR[:, 0], [1.0, 0.0])
    assert info.errors == {"b": 0}


def test_math_verify_off_the_main_thread_compares_without_its_timeout_notice(caplog):
    """An asynchronous run scores in a background thread, where math-verify's `signal.alarm` timeouts cannot
    run: it still compares (symbolically here), and its "Timeout is disabled" warning is not logged."""
    import logging
    import threading

    from jaxrl.rewards.answers import math_equal

    out = []
    with caplog.at_level(logging.WARNING):
        worker = threading.Thread(target=lambda: out.extend([math_equal("\\frac{x}{2}", "x/2"),
                                                             math_equal("\\frac{x}{2}", "x/3")]))
        worker.start()
        worker.join()
    assert out == [True, False]
    assert not [r for r in caplog.records if r.name.startswith("math_verify")], caplog.records
