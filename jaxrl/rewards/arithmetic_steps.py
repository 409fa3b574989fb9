"""A toy step checker and premise audit for "What is a op b?" problems (the PRM of configs/evpv_tiny.yaml).

A text stand-in for EVPV-PRM's two judges (arXiv:2603.16253): the problem statement plays the image's part.

* `step_rewards(prompt, steps)`: r_t = +1 when every equation "x op y = z" written in step t is right and, for
  the last step, its last number is the problem's result; else −1.
* `premise_audit(prompt, steps)`: step t depends on the premise when it quotes an operation "x op y"; a quoted
  operation whose operands are not the problem's (as a set) is a high-severity contradiction (the premise was
  misread), one with the problem's operands but another operator a low-severity one. Returns
  (V as T booleans, n_high, n_low) for `jaxrl.rewards.judges.evpv_gate.evpv_reward`.
"""

from __future__ import annotations

import re
from typing import Sequence

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_OPERATION = re.compile(r"(\d+)\s*([+*-])\s*(\d+)")
_EQUATION = re.compile(r"(\d+)\s*([+*-])\s*(\d+)\s*=\s*(-?\d+)")
_NUMBER = re.compile(r"-?\d+")


def _problem(prompt: str) -> tuple[int, str, int]:
    match = _OPERATION.search(prompt)
    if match is None:
        raise ValueError(f"no 'a op b' problem in the prompt {prompt!r}")
    return int(match.group(1)), match.group(2), int(match.group(3))


def step_rewards(prompt: str, steps: Sequence[str]) -> list[float]:
    """+1 / −1 per step (see the module docstring)."""
    a, op, b = _problem(prompt)
    result = _OPS[op](a, b)
    out = []
    for t, step in enumerate(steps):
        ok = all(_OPS[o](int(x), int(y)) == int(z) for x, o, y, z in _EQUATION.findall(step))
        if t == len(steps) - 1:
            numbers = _NUMBER.findall(step)
            ok = ok and bool(numbers) and int(numbers[-1]) == result
        out.append(1.0 if ok else -1.0)
    return out


def premise_audit(prompt: str, steps: Sequence[str]) -> tuple[list[bool], int, int]:
    """(premise-dependent steps, high-severity count, low-severity count); see the module docstring."""
    a, op, b = _problem(prompt)
    visual, n_high, n_low = [], 0, 0
    for step in steps:
        quoted = _OPERATION.findall(step)
        visual.append(bool(quoted))
        for x, o, y in quoted:
            if sorted((int(x), int(y))) != sorted((a, b)):
                n_high += 1
            elif o != op:
                n_low += 1
    return visual, n_high, n_low
