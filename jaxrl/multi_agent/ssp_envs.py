"""SSP's environments: the Proposer's search episode, and the SFT warm start's demonstrations of each role.

"Search Self-Play", arXiv:2510.18821; the loop that runs them is `jaxrl.multi_agent.ssp.SspSystem`. The world
(`jaxrl.data.entities`) is built once per (seed, size) and shared by every episode.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from jaxrl.data.entities import build_world
from jaxrl.envs.base import StepResult, prompt_ids
from jaxrl.envs.search import ToolEnv
from jaxrl.envs.tools import format_results
from jaxrl.multi_agent.ssp_text import noisy_materials, proposer_text

if TYPE_CHECKING:
    from jaxrl.multi_agent.ssp import SspSystem

ROLES = ("proposer", "solver")


@functools.lru_cache(maxsize=4)
def cached_world(seed: int, size: str):
    """`build_world` once per (seed, size): environments are built per episode (0.16 s for "rooms")."""
    return build_world(seed, size)


@functools.lru_cache(maxsize=4)
def _docs_by_name(seed: int, size: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in cached_world(seed, size).contents:
        out.setdefault(c.partition("\n")[0], []).append(c)
    return out


class ProposerEnv(ToolEnv):
    """Search the world, then `<question>…</question>` ends the episode (reward 0: scored after solving)."""

    def __init__(self, tokenizer, *, corpus_seed: int = 0, corpus_size: str = "tiny", top_k: int = 1,
                 query_with_question: bool = False, short_prompt: bool = False):
        world = cached_world(int(corpus_seed), str(corpus_size))
        self.short_prompt = bool(short_prompt)
        super().__init__(tokenizer, tools=("search",), tool_kwargs={"search": {"contents": world.contents,
                                                                                "top_k": top_k}})
        self.stop_strings = ("</search>", "</question>")
        self.query_with_question, self.question = bool(query_with_question), ""

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        self.question = str(record.get("question", ""))
        text = proposer_text(str(record["answers"][0]), int(record.get("hops", 1)), self.short_prompt)
        return prompt_ids(self.tokenizer, [{"role": "user", "content": text}])

    def step(self, action) -> StepResult:
        if "<question>" in action.text:
            return StepResult([], 0.0, True, {})
        if self.query_with_question:  # as SearchEnv's option, with the record's own (unseen) question
            q = self.question
            text = re.sub(r"<search>(.*?)</search>", lambda m: f"<search>{q} {q} {m.group(1)}</search>",
                          action.text, flags=re.DOTALL)
            action = dataclasses.replace(action, text=text)
        res = super().step(action)
        return StepResult(res.observation, 0.0, res.done, res.info)

    def demonstration(self, record: Mapping[str, Any]) -> list[str]:
        return proposer_demonstration(record)


def proposer_demonstration(record: Mapping[str, Any], query: str = "chain") -> list[str]:
    """Search the chain (`query` "answer": a* instead of its first name), then ask the world's own
    question about a* (valid: a* is not in it)."""
    names = list(record["chain"])
    if query == "answer":
        names[0] = str(record["answers"][0])
    return [f"<search>{n}</search>" for n in names] + [f"<question>{record['question']}</question>"]


class VerifierDemoEnv:
    """The RAG check's prompt for a record (its own documents plus the system's `rag_others` other ones, as
    `noisy_materials` mixes them, in the system's `rag_layout`), answered in one turn; `demonstration` is the
    record's answer."""

    def __init__(self, tokenizer, system: "SspSystem"):
        self.tokenizer, self.system, self.others = tokenizer, system, system.rag_others
        seed, size = system.world["corpus_seed"], system.world["corpus_size"]
        self.world, self.by_name = cached_world(seed, size), _docs_by_name(seed, size)
        self.top_k, self.stop_strings = system.world["top_k"], ("</answer>",)

    def materials(self, record: Mapping[str, Any]) -> tuple[str, list[str]]:
        """(the record's chain documents, `others` other documents chosen by crc32 of the question)."""
        docs = self.world.contents
        own = "\n\n".join(format_results(self.by_name.get(n, [])[: self.top_k]) for n in record["chain"])
        rng = np.random.default_rng(zlib.crc32(("verify:" + str(record["question"])).encode()))
        picked = [format_results([docs[int(i)]]) for i in rng.choice(len(docs), self.others + 1, replace=False)]
        return own, [m for m in picked if m != own][: self.others]

    def reset(self, record):
        own, others = self.materials(record)
        key = zlib.crc32(str(record["question"]).encode())
        materials = noisy_materials(own, others, key, self.others)
        return self.system.verifier_ids(materials, str(record["question"]))

    def step(self, action):
        return StepResult([], 0.0, True, {})

    def demonstration(self, record) -> list[str]:
        return [f"<answer>{record['answers'][0]}</answer>"]


class SspDemoEnv:
    """SFT warm start: each record demonstrates one role (crc32 of its question), searches served live:
    the Proposer or the Solver, or also the RAG check's verifier with `verifier_demos`."""

    def __init__(self, tokenizer, system: "SspSystem"):
        self.tokenizer, self.system, self.inner = tokenizer, system, None
        self.stop_strings = ("</search>", "</question>", "</answer>")
        self.roles = ROLES + ("verifier",) if system.verifier_demos else ROLES

    def _role(self, record) -> str:
        return self.roles[zlib.crc32(str(record["question"]).encode()) % len(self.roles)]

    def _env(self, record):
        role = self._role(record)
        if role == "verifier":
            return VerifierDemoEnv(self.tokenizer, self.system)
        return (self.system.proposer_env if role == "proposer" else self.system.solver_env)(self.tokenizer)

    def reset(self, record):
        self.inner = self._env(record)
        return self.inner.reset(record)

    def step(self, action):
        return self.inner.step(action)

    def demonstration(self, record) -> list[str]:
        """The Proposer's `proposer_demonstration`, the Solver's `SearchEnv.demonstration` (searching for a
        `solver_demo_search` share of questions, else a guess), the verifier's answer."""
        if self._role(record) == "proposer":
            return proposer_demonstration(record, self.system.proposer_query)
        return self._env(record).demonstration(record)
