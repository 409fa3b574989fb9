"""`SearchEnv` that logs every episode it starts and every action it answers to a file of its process, so the
multi-host test can count how often each host ran an environment. Named by path in the test's config
(`env.name=.../mh_env.py:LoggedSearchEnv`). `min_turns`: an action before that turn that neither searches nor
answers is searched for as it is (a result comes back, the episode goes on), so that a barely trained model's
episodes have several turns."""

from __future__ import annotations

import dataclasses
import os

from jaxrl.envs import SearchEnv
from jaxrl.envs.search import SEARCH_INSTRUCTIONS


class LoggedSearchEnv(SearchEnv):
    def __init__(self, tokenizer, *, log_dir: str, corpus_seed: int = 0, corpus_size: str = "tiny",
                 top_k: int = 1, demo_search: float = 1.0, query_with_question: bool = False,
                 instructions: str = SEARCH_INSTRUCTIONS, min_turns: int = 1):
        super().__init__(tokenizer, corpus_seed=corpus_seed, corpus_size=corpus_size, top_k=top_k,
                         demo_search=demo_search, query_with_question=query_with_question,
                         instructions=instructions)
        self.log_path = os.path.join(log_dir, f"env.{os.getpid()}.log")
        self.min_turns, self.turn = int(min_turns), 0

    def _log(self, line: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")

    def reset(self, record):
        self._log(f"reset {record['question']}")
        self.turn = 0
        return super().reset(record)

    def step(self, action):
        self._log(f"step {action.text}")
        self.turn += 1
        if self.turn < self.min_turns and not any(t in action.text for t in ("<search>", "<answer>")):
            action = dataclasses.replace(action, text=f"<search>{action.text}</search>")
        return super().step(action)
