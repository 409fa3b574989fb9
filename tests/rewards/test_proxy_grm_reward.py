"""The `proxy_grm` reward: r_acc parsed from the GRM's answer, r_proxy from a proxy judge shown only the
rubric, r_fmt from the layout, combined by losses.research.proxy_grm; checked against hand-computed values."""

import numpy as np
import pytest

from jaxrl.config import RewardSpec
from jaxrl.errors import ConfigError
from jaxrl.rewards import resolve, score
from jaxrl.rewards.judges.proxy_grm import extract_rubric, format_ok

COMPLETIONS = [
    "<rubric>Check the sum.</rubric><eval>R1 is right</eval><answer>1</answer>",      # acc +1, fmt 1
    "<rubric>Be brief<justify>x</justify></rubric><eval>e</eval><answer>2</answer>",   # acc −1, fmt 1
    "<answer>1 or 2</answer>",                                                         # names both: −1, fmt 0
    "<think>t</think>\n<summary>s</summary>\n<answer>2</answer>",                      # acc +1, fmt 1
]
FIELDS = {"answer": ["1", "1", "2", "<answer>2</answer>"], "question": ["q0", "q1", "q2", "q3"],
          "response_1": ["a0", "a1", "a2", "a3"], "response_2": ["b0", "b1", "b2", "b3"]}
SEEN = []


def proxy(question, response_1, response_2, rubric):
    """Picks 1 / 1 (untagged, last digit) / fails / 1 for the four rubrics."""
    SEEN.append((question, response_1, response_2, rubric))
    if "Check the sum" in rubric:
        return "<think>fine</think><answer>1</answer>"
    if "Be brief" in rubric:
        return "first 2, then 1"
    if "1 or 2" in rubric:
        raise RuntimeError("proxy server down")
    return "<answer>1</answer>"


def proxy_texts(requests):
    SEEN.append(list(requests))
    return ["<answer>2</answer>", "no pick", None, "<answer>2</answer>"]


def _reward(**params):
    spec = RewardSpec(name="grm", type="proxy_grm", params=params)
    rewards, _ = score(resolve([spec]), ["p"] * 4, COMPLETIONS, FIELDS)
    return rewards[:, 0]


def test_components():
    assert extract_rubric(COMPLETIONS[1]) == "<rubric>Be brief</rubric>"
    assert [format_ok(c) for c in COMPLETIONS] == [True, True, False, True]
    assert format_ok("<answer>1</answer>", r"<answer>[12]</answer>")
    assert not format_ok("<rubric>a</rubric><rubric>b</rubric><eval>e</eval><answer>1</answer>")


@pytest.mark.parametrize("params,expected", [
    # r_acc = [1, −1, −1, 1], r_proxy = [1, 1, 0, −1], r_fmt = [1, 1, 0, 1]
    ({}, [2.5, 0.5, -1.0, 0.5]),
    ({"use_fb": 1}, [2.5, -1.5, -1.0, -1.5]),      # acc∧proxy=−1 → acc −1; ¬acc∧proxy=+1 → both −1
    ({"use_fb": 7}, [2.0, -0.5, -1.0, 1.0]),       # acc → 1.5 / 0.5, ¬acc → −1, proxy dropped
    ({"format_weight": 0.0}, [2.0, 0.0, -1.0, 0.0]),
])
def test_proxy_function_hand_computed(params, expected):
    SEEN.clear()
    np.testing.assert_allclose(_reward(proxy=f"{__name__}:proxy", **params), expected, atol=1e-6)
    assert SEEN[1] == ("q1", "a1", "b1", "<rubric>Be brief</rubric>")          # only the rubric, cut


def test_without_proxy_and_with_a_text_judge():
    np.testing.assert_allclose(_reward(use_proxy=False), [1.5, -0.5, -1.0, 1.5], atol=1e-6)
    SEEN.clear()
    # picks 2 / none / no reply / 2 → r_proxy = [−1, −1, 0, +1]
    got = _reward(proxy={"generate": f"{__name__}:proxy_texts"})
    np.testing.assert_allclose(got, [0.5, -1.5, -1.0, 2.5], atol=1e-6)
    assert len(SEEN) == 1 and "Question: q0\nResponse 1: a0\nResponse 2: b0\n" in SEEN[0][0]
    assert "Evaluation rubric: <rubric>Check the sum.</rubric>\n" in SEEN[0][0]


@pytest.mark.parametrize("params,message", [
    ({"use_fb": 11, "use_proxy": False}, "rewards[grm].params.use_fb=11: allowed values are 0..10"),
    ({}, "rewards[grm].params.proxy: required with use_proxy"),
    ({"proxy": {"model": "/no/such"}}, "rewards[grm].params.proxy.model='/no/such': does not exist"),
    ({"use_proxy": False, "format_pattern": "("}, "params.format_pattern='(': not a valid regex"),
])
def test_config_errors(params, message):
    with pytest.raises(ConfigError) as e:
        resolve([RewardSpec(name="grm", type="proxy_grm", params=params)])
    assert message in str(e.value)
