"""`jaxrl.rewards.score_rows`: the one scoring path of single-turn rows, environment episodes and multi-agent
roles. A reward sees each row's dataset fields (not the data encoder's keys) and its completion length; with
owners, this host scores only its rows and the matrix and report are the gathered ones (one process here: every
row is its own; tests/sharding/test_multihost_cli.py runs it on two hosts)."""

from __future__ import annotations

import numpy as np

from jaxrl.config import RewardSpec
from jaxrl.rewards import resolve, score, score_rows

SEEN: list[dict] = []


def _fields(prompts, completions, **fields):
    SEEN.append(fields)
    return [float(len(c) == n) + float(a == c) for c, n, a in zip(completions, fields["completion_length"],
                                                                   fields["answer"])]


def test_rows_get_their_fields_and_lengths_with_or_without_owners():
    rewards = resolve([RewardSpec(name="f", function=f"{__name__}:_fields"),
                       RewardSpec(name="answer", type="exact_answer", weight=0.5)])
    records = [{"prompt": "p0", "prompt_ids": [1], "sft_target": "x", "target_ids": [2], "answer": "ab",
                "level": 1},
               {"prompt": "p1", "prompt_ids": [3], "sft_target": "y", "target_ids": [4], "answer": "abc",
                "level": 2}]
    completions, lengths = ["ab", "<answer>abc</answer>"], np.array([2, 7])
    SEEN.clear()
    alone, info = score_rows(rewards, ["p0", "p1"], completions, records, lengths)
    assert sorted(SEEN[0]) == ["answer", "completion_length", "level"]  # no encoder keys
    np.testing.assert_array_equal(alone[:, 0], [2.0, 0.0])  # length 2 and the answer; neither
    want, want_info = score(rewards, ["p0", "p1"], completions, {"answer": ["ab", "abc"], "level": [1, 2],
                                                                 "completion_length": [2, 7]})
    np.testing.assert_array_equal(alone, want)
    owned, owned_info = score_rows(rewards, ["p0", "p1"], completions, records, lengths, np.zeros(2, np.int32))
    np.testing.assert_array_equal(owned, want)
    assert owned_info.metrics == want_info.metrics == info.metrics and owned_info.num_samples == 2
