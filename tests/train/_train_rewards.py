"""Deterministic user rewards for trainer tests (`_train_rewards:<name>`, with tests/train on the path).

An untrained tiny model emits random characters, so the built-in answer reward is 0 everywhere and every group
would be degenerate (zero advantage, zero gradient). These rewards vary within a group: updates are non-zero.
"""


def digit_frac(prompts, completions, **fields):
    """Fraction of characters that are digits (0 for an empty completion)."""
    del prompts, fields
    return [sum(c.isdigit() for c in s) / len(s) if s else 0.0 for s in completions]


def short(prompts, completions, completion_length, **fields):
    """1 - completion_length / 8: prefers completions that stop early."""
    del prompts, completions, fields
    return [1.0 - n / 8 for n in completion_length]


def has_digit(prompts, completions, **fields):
    """1 where the completion contains a digit, else 0: full marks or none (a binary task reward)."""
    del prompts, fields
    return [float(any(c.isdigit() for c in s)) for s in completions]
