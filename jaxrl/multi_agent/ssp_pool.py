"""SSP's problem pool: earlier problems that fill the Solver slots of failed proposals.

Spec/multi-agent.md §2.6-2.7 (reference: Alibaba-Quark/SSP, `quarl/utils/ssp_data_manager.py`, with
`extraction_failure.strategy = "reuse"`): a slot whose proposal failed extraction or validation takes a
problem drawn from the pool of earlier problems whose recorded Solver success rate is at most `threshold`
(script: 1.0, any problem); when none is eligible, any pool problem (`fallback_any`, the reference's
`get_problems_by_success_rate`), and a dummy problem when the pool is empty (or, `fallback_any` off, when
none is eligible). After solving, every non-dummy
problem of the step (valid or reused) is pushed with its success rate; every `clear_every` steps the pool is
emptied (`keep_ratio = 0`): after step k when (k + `clear_offset`) is a multiple of `clear_every`. The
reference's `fit` advances its step counter before that test, so it clears after steps 9, 19, … for an
interval of 10 (`clear_offset` 1); offset 0 clears after steps 10, 20, … (jaxrl before issue 28). The pool
is host-side state that goes into checkpoints (`state_json`), so a resumed run draws the same problems.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass
class ProblemPool:
    """Problems as {"question", "answer", "success", "step"}; `steps` counts the training collects."""

    threshold: float = 1.0
    clear_every: int = 10
    clear_offset: int = 1
    fallback_any: bool = True
    problems: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    steps: int = 0

    def fill(self, valid_P: Sequence[bool], key: int) -> list[dict[str, Any] | None]:
        """A pool problem for each failed slot (uniform over the eligible ones, else over the whole pool with
        `fallback_any`; drawn with `key`); None for a valid slot or when there is nothing to draw (the caller's
        dummy problem)."""
        eligible = [p for p in self.problems if p["success"] <= self.threshold]
        if not eligible and self.fallback_any:
            eligible = list(self.problems)
        rng = np.random.default_rng(int(key))
        return [None if ok or not eligible else eligible[int(rng.integers(len(eligible)))] for ok in valid_P]

    def push(self, problems: Sequence[tuple[str, str, float]]) -> None:
        """This step's (question, answer, success rate) problems; then the periodic clear."""
        self.steps += 1
        self.problems += [{"question": q, "answer": a, "success": float(p), "step": self.steps}
                          for q, a, p in problems]
        if self.clear_every > 0 and (self.steps + self.clear_offset) % self.clear_every == 0:
            self.problems = []

    def state_json(self) -> dict[str, Any]:
        return {"problems": [dict(p) for p in self.problems], "steps": self.steps}

    def load_state(self, data: dict[str, Any]) -> None:
        self.problems = [dict(p) for p in data["problems"]]
        self.steps = int(data["steps"])
