"""A deterministic pairwise judge for the multi-host reward test: prefers the completion with more digits,
then the shorter one. Imported by `jaxrl train` subprocesses as `mh_judge:by_digits` (tests/sharding on
PYTHONPATH)."""


def by_digits(prompt: str, a: str, b: str) -> float:
    del prompt
    digits = lambda s: sum(c.isdigit() for c in s)
    return float(digits(a) - digits(b)) + 0.1 * (len(b) - len(a))
