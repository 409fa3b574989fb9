"""A user environment in one file (README, "Agentic RL"): guess a number, told "higher" or "lower".

Name it in a config, no registration needed:

    env:
      name: docs/agentic_guess_env.py:GuessEnv      # "path/file.py:Class" or "package.module:Class"
      params: {low: 0, high: 100}
      max_turns: 6

The secret is the `answer` field of each data record (e.g. `data.source: arithmetic`, "What is 47 + 3?" ->
50), so the model can compute it or find it by bisection. Each turn the model writes `<guess>n</guess>`
(the closing tag is a stop string, so the turn ends there); the environment appends " higher\\n" or
" lower\\n" as observation tokens (masked out of the loss) until the guess is right (reward 1) or the turns
run out (reward 0). `demonstration` is optional: with it, `sft_warmup.steps > 0` trains on bisection
episodes laid out exactly like sampled ones.
"""

from __future__ import annotations

import re

from jaxrl.envs import Action, StepResult, encode_text, prompt_ids

_GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")


class GuessEnv:
    """Guess `record["answer"]` within [low, high]; reward 1 for a right guess, 0 otherwise."""

    stop_strings = ("</guess>",)

    def __init__(self, tokenizer, *, low: int = 0, high: int = 100):
        if int(low) > int(high):
            raise ValueError(f"low={low} > high={high}")
        self.tokenizer, self.low, self.high = tokenizer, int(low), int(high)
        self.secret = None

    def reset(self, record) -> list[int]:
        self.secret = int(record["answer"])
        text = (f"Guess the number between {self.low} and {self.high} with <guess>n</guess>. "
                f"Hint: {record['prompt']}")
        return prompt_ids(self.tokenizer, [{"role": "user", "content": text}])

    def step(self, action: Action) -> StepResult:
        found = _GUESS.findall(action.text)
        if action.eos or not found:  # no guess: the episode ends, as a malformed tool call would
            return StepResult([], 0.0, True, {"correct": False})
        guess = int(found[-1])
        if guess == self.secret:
            return StepResult([], 1.0, True, {"correct": True})
        hint = " higher\n" if guess < self.secret else " lower\n"
        return StepResult(encode_text(self.tokenizer, hint), 0.0, False, {"correct": False})

    def demonstration(self, record) -> list[str]:
        """Bisection over [low, high] down to the secret: the action texts of a successful episode."""
        lo, hi, secret, out = self.low, self.high, int(record["answer"]), []
        while True:
            mid = (lo + hi) // 2
            out.append(f"<guess>{mid}</guess>")
            if mid == secret:
                return out
            lo, hi = (mid + 1, hi) if mid < secret else (lo, mid - 1)
