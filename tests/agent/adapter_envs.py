"""Environments written for other libraries' APIs, for tests/agent/test_env_adapters.py.

`FrozenLakeText`: gymnasium has no text environment, and the maintained text-env package that follows its
convention (gem-llm) pins reasoning-gym 0.1.23 against our 0.1.25; so gymnasium's own toy-text FrozenLake is
wrapped with gymnasium's `Wrapper` API into the text convention, through a documented observation -> text
function (`lake_text`) and action text -> move parser. `AddEnv`: TRL's `environment_factory` convention
(trl ships no example environment importable from the package). The rest are broken on purpose.
"""

from __future__ import annotations

import re

import gymnasium

MOVES = ("left", "down", "right", "up")  # FrozenLake's actions 0, 1, 2, 3
_MOVE = re.compile(r"\b(left|down|right|up)\b")
INVALID = "Invalid move: write left, down, right or up."


def lake_text(state: int, desc) -> str:
    """FrozenLake's observation (the agent's cell index) as text: the map, one row a line, with the agent's
    cell shown as '@' (S start, F frozen, H hole, G goal). `desc` is the env's map (bytes array)."""
    rows = [[c.decode() for c in row] for row in desc]
    ncol = len(rows[0])
    rows[state // ncol][state % ncol] = "@"
    return "\n".join("".join(r) for r in rows)


class FrozenLakeText(gymnasium.Wrapper):
    """FrozenLake-v1 in the gymnasium text convention: `reset() -> (map text, info)`, `step(text)` reads the
    last direction word of the action text; a text without one is refused with an observation saying so
    (reward 0, the episode goes on). `options` of reset (the dataset record) are kept in `self.options`."""

    def __init__(self, slippery: bool = False):
        super().__init__(gymnasium.make("FrozenLake-v1", is_slippery=slippery))
        self.options = None

    def reset(self, *, seed=None, options=None):
        self.options = options
        state, info = self.env.reset(seed=seed)
        return lake_text(int(state), self.env.unwrapped.desc), info

    def step(self, action: str):
        found = _MOVE.findall(action.lower())
        if not found:
            return INVALID, 0.0, False, False, {"invalid": True}
        state, reward, terminated, truncated, info = self.env.step(MOVES.index(found[-1]))
        return lake_text(int(state), self.env.unwrapped.desc), float(reward), terminated, truncated, info


class AddEnv:
    """TRL `environment_factory` convention: `reset(**row)`, the tool `add`, `get_reward` (1 when the last
    sum equals the row's answer)."""

    def __init__(self):
        self.answer, self.last = None, None

    def reset(self, **kwargs) -> str | None:
        self.answer, self.last = str(kwargs.get("answer")), None
        return " Use add."

    def add(self, a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.last = int(a) + int(b)
        return self.last

    def get_reward(self) -> float:
        return float(str(self.last) == self.answer)


class NoReset:
    """TRL's convention without its reset (the common mistake)."""

    def add(self, a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b


class IntLake(FrozenLakeText):
    """Forgets to render at its second step: returns FrozenLake's int state (a non-text observation)."""

    def step(self, action: str):
        self.k = getattr(self, "k", 0) + 1
        obs, *rest = super().step("down")
        return (4 if self.k == 2 else obs, *rest)


class Endless:
    """A gymnasium-style text env that never terminates: only jaxrl's env.max_turns ends it."""

    def reset(self, *, seed=None, options=None):
        return "Say anything.", {}

    def step(self, action: str):
        return "Go on.", 0.5, False, False, {}


class Raising(Endless):
    """Raises at its second step."""

    def __init__(self):
        self.k = 0

    def step(self, action: str):
        self.k += 1
        if self.k == 2:
            raise RuntimeError("the game server is down")
        return super().step(action)


def digit_frac(prompts, completions, **fields):
    """A reward that varies inside a group on an untrained model (the fraction of digit characters), so the
    test's update has non-zero advantages."""
    del prompts, fields
    return [sum(c.isdigit() for c in s) / len(s) if s else 0.0 for s in completions]
