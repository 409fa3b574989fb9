"""Host-side input checks, buckets and left padding of the rollout engine."""

import numpy as np
import pytest

from jaxrl.sampling.batching import bucket, check_prompts, check_settings, left_pad

_OK = dict(max_new_tokens=4, num_samples=2, temperature=1.0, top_k=None, top_p=None, eos_ids=(3,), pad_id=0,
           vocab_size=10)


def test_bucket_picks_smallest_fitting():
    assert bucket(5, (16, 8, 32), "prompt") == 8
    assert bucket(8, (8, 16), "prompt") == 8
    assert bucket(9, (8, 16), "prompt") == 16
    assert bucket(9, None, "prompt") == 9
    with pytest.raises(ValueError, match="prompt of 40 tokens exceeds the largest prompt bucket \\(32\\)"):
        bucket(40, (16, 32), "prompt")


def test_left_pad():
    tokens, mask = left_pad([[5, 6, 7], [9]], 4, pad_id=1)
    np.testing.assert_array_equal(tokens, [[1, 5, 6, 7], [1, 1, 1, 9]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
    assert tokens.dtype == np.int32 and mask.dtype == bool


@pytest.mark.parametrize("prompts,match", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([[1, 2], []], "prompt 1 is empty"),
    ([[1, 12]], r"prompt 0 has token ids \[12\] outside the vocabulary \[0, 10\)"),
    ([[-1]], "outside the vocabulary"),
])
def test_bad_prompts(prompts, match):
    with pytest.raises(ValueError, match=match):
        check_prompts(prompts, vocab_size=10)


def test_prompts_accept_numpy_rows():
    assert check_prompts([np.array([1, 2]), (3,)], vocab_size=10) == [[1, 2], [3]]


@pytest.mark.parametrize("override,match", [
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(num_samples=0), "num_samples must be >= 1"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(top_k=0), "top_k must be None or >= 1"),
    (dict(top_p=0.0), r"top_p must be None or in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be None or in \(0, 1\]"),
    (dict(eos_ids=(3, 10)), r"eos_ids \[10\] are outside the vocabulary \[0, 10\)"),
    (dict(pad_id=11), "pad_id 11 is outside the vocabulary"),
])
def test_bad_settings(override, match):
    with pytest.raises(ValueError, match=match):
        check_settings(**{**_OK, **override})


def test_good_settings_return_eos_tuple():
    assert check_settings(**{**_OK, "eos_ids": [3, 4]}) == (3, 4)
