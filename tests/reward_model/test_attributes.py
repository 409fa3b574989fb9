"""Attribute extraction on hand-made strings, and the synthetic task's planted bias rates."""

import numpy as np
import pytest

from jaxrl.errors import UserError
from jaxrl.reward_model.attributes import format_score, length_score, pair_attribute, sycophancy_score
from jaxrl.reward_model.data import batch_indices, synthetic_pairs
from jaxrl.io.tokenizer import builtin_tokenizer


def test_length_counts_tokens_or_characters():
    tok = builtin_tokenizer()
    assert length_score("abc de") == 6
    assert length_score("abc de", tok) == 6            # one token per character
    assert length_score("", tok) == 0


@pytest.mark.parametrize("text,want", [
    ("Yes, you are right. 7", 1), ("  \"You're absolutely right! It is 3", 1), ("Great question: 4", 1),
    ("7. Yes, you are right.", 0), ("No, that is wrong.", 0), ("", 0),
])
def test_sycophancy(text, want):
    assert sycophancy_score(text) == want


@pytest.mark.parametrize("text,want", [
    ("- one\n- two\n* three", 3), ("1. a\n2) b", 2), ("**bold** and __also__", 2), ("- **7**", 2),
    ("plain 3 - 2 = 1", 0), ("a ** b ** c", 1), ("-not a list", 0),
])
def test_format(text, want):
    assert format_score(text) == want


def test_pair_attribute_is_relative_and_ties_are_zero():
    a = pair_attribute("length", ["long answer", "x", "same"], ["short", "longer", "same"])
    np.testing.assert_array_equal(a, [1, 0, 0])
    np.testing.assert_array_equal(pair_attribute("format", ["- a\n- b", "x"], ["x", "**y**"]), [1, 0])
    with pytest.raises(UserError, match="allowed values are 'length', 'sycophancy', 'format'"):
        pair_attribute("people", ["a"], ["b"])


@pytest.mark.parametrize("bias", ["length", "sycophancy", "format"])
def test_synthetic_bias_rate(bias):
    pairs = synthetic_pairs(2000, 0, chosen_decorated_rate=0.8, bias=bias)
    a = pair_attribute(bias, [p["chosen"] for p in pairs], [p["rejected"] for p in pairs])
    assert 0.77 < a.mean() < 0.83
    for p in pairs[:50]:   # chosen holds the correct sum
        x, y = p["prompt"][:-1].split("+")
        assert p["chosen"].endswith(str(int(x) + int(y))) or p["chosen"].endswith(f"{int(x) + int(y)}**")
    balanced = synthetic_pairs(2000, 1, chosen_decorated_rate=0.5, bias=bias)
    a_bal = pair_attribute(bias, [p["chosen"] for p in balanced], [p["rejected"] for p in balanced])
    assert 0.47 < a_bal.mean() < 0.53


def test_batch_indices_cover_each_epoch_once():
    idx = np.concatenate([batch_indices(s, 10, 4, 0) for s in range(5)])   # 20 samples = 2 epochs
    assert sorted(idx[:10]) == list(range(10)) and sorted(idx[10:]) == list(range(10))
    np.testing.assert_array_equal(batch_indices(3, 10, 4, 0), batch_indices(3, 10, 4, 0))
