"""`SearchEnv` that logs every episode it starts and every action it answers to a file of its process, so the
multi-host test can count how often each host ran an environment. Named by path in the test's config
(`env.name=.../mh_env.py:LoggedSearchEnv`)."""

from __future__ import annotations

import os

from jaxrl.envs import SearchEnv
from jaxrl.envs.search import SEARCH_INSTRUCTIONS


class LoggedSearchEnv(SearchEnv):
    def __init__(self, tokenizer, *, log_dir: str, corpus_seed: int = 0, corpus_size: str = "tiny",
                 top_k: int = 1, demo_search: float = 1.0, query_with_question: bool = False,
                 instructions: str = SEARCH_INSTRUCTIONS):
        super().__init__(tokenizer, corpus_seed=corpus_seed, corpus_size=corpus_size, top_k=top_k,
                         demo_search=demo_search, query_with_question=query_with_question,
                         instructions=instructions)
        self.log_path = os.path.join(log_dir, f"env.{os.getpid()}.log")

    def _log(self, line: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")

    def reset(self, record):
        self._log(f"reset {record['question']}")
        return super().reset(record)

    def step(self, action):
        self._log(f"step {action.text}")
        return super().step(action)
