"""Tool-calling environments: `ToolEnv` (any registered tools) and `SearchEnv` (fictional-entity QA).

Action format, Search-R1 style (arXiv:2503.09516): the model writes `<search>query</search>` (or
`<calculator>expr</calculator>`), the turn stops at the closing tag, the environment appends

    \\n<result>\\n{tool output or "error: …"}\\n</result>\\n

(obs_format "inline", text inside the assistant turn) or the same text as a chat message (obs_format
"message", rendered once by `message_ids`), and the model continues. An `<answer>…</answer>` ends the
episode with reward 1 for an exact match (SQuAD normalisation: lower case, no punctuation or articles,
single spaces) against any gold answer, else 0. EOS, or a turn with neither a call nor an answer, ends it
with reward 0. A tool call can earn `call_reward` (a per-turn shaping reward, 0 by default).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
import zlib
from typing import Any, Mapping, Sequence

from jaxrl.data.entities import build_world
from jaxrl.envs.base import Action, StepResult, encode_text, message_ids, prompt_ids
from jaxrl.envs.tools import TOOLS, ToolError, find_calls
from jaxrl.errors import EnvError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
OBS_FORMATS = ("inline", "message")
SEARCH_INSTRUCTIONS = "Search with <search>name</search>, then reply <answer>...</answer>."


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles a/an/the, single spaces (SQuAD, arXiv:1606.05250)."""
    text = "".join(ch for ch in str(text).lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def end_or_calls(action: Action, answers: Sequence[str], tools: Sequence[str],
                 limit: int) -> StepResult | list[tuple[str, str]]:
    """A tool-using turn read the one way every built-in env reads it: an `<answer>` ends the episode (reward
    1 iff it matches one of `answers`), a turn without a call (or ending on EOS) ends it with 0; otherwise the
    turn's first `limit` (tool, argument) calls, for the env to run."""
    given = _ANSWER.findall(action.text)
    if given:
        ok = exact_match(given[-1], answers)
        return StepResult([], float(ok), True, {"answer": given[-1].strip(), "correct": ok})
    calls = find_calls(action.text, tuple(tools))[:limit]
    if action.eos or not calls:
        return StepResult([], 0.0, True, {"answer": None, "correct": False})
    return calls


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    return normalize_answer(prediction) in {normalize_answer(a) for a in answers}


class ToolEnv:
    """Question answering with tools: calls are served until an `<answer>`; reward = exact match.

    Args:
      tokenizer: the model's tokenizer.
      tools: names in `jaxrl.envs.tools.TOOLS` (search needs `corpus_seed`/`corpus_size`, see SearchEnv).
      instructions: the text before "Question: …" in the user message ({tools} is replaced by the tags).
      obs_format: "inline" or "message" (see the module docstring).
      calls_per_turn: at most this many calls of one action are served (the rest are ignored).
      call_reward: reward of a turn whose calls all succeed (a per-turn shaping term).
      tool_kwargs: extra constructor arguments per tool name.
    """

    def __init__(self, tokenizer, *, tools: Sequence[str] = ("calculator",),
                 instructions: str = "Use {tools} when needed, then reply <answer>...</answer>.",
                 obs_format: str = "inline", calls_per_turn: int = 1, call_reward: float = 0.0,
                 tool_kwargs: Mapping[str, Mapping[str, Any]] | None = None):
        unknown = [t for t in tools if t not in TOOLS]
        if unknown or not tools:
            raise ValueError(f"tools={list(tools)!r}: allowed names are {', '.join(map(repr, TOOLS))}")
        if obs_format not in OBS_FORMATS:
            allowed = ", ".join(map(repr, OBS_FORMATS))
            raise ValueError(f"obs_format={obs_format!r}: allowed values are {allowed}")
        if int(calls_per_turn) < 1:
            raise ValueError(f"calls_per_turn must be >= 1, got {calls_per_turn}")
        kwargs = dict(tool_kwargs or {})
        self.tokenizer, self.obs_format = tokenizer, obs_format
        self.tools = {t: TOOLS[t](**kwargs.get(t, {})) for t in tools}
        self.instructions = instructions.replace("{tools}", ", ".join(f"<{t}>...</{t}>" for t in tools))
        self.calls_per_turn, self.call_reward = int(calls_per_turn), float(call_reward)
        self.stop_strings = tuple(f"</{t}>" for t in tools) + ("</answer>",)
        self.answers: list[str] = []

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        if "question" not in record or "answers" not in record:
            raise ValueError(
                f"a {type(self).__name__} record needs 'question' and 'answers'; got {sorted(record)}")
        self.answers = [str(a) for a in record["answers"]]
        user = f"{self.instructions}\nQuestion: {record['question']}"
        return prompt_ids(self.tokenizer, [{"role": "user", "content": user}])

    def step(self, action: Action) -> StepResult:
        calls = end_or_calls(action, self.answers, tuple(self.tools), self.calls_per_turn)
        if isinstance(calls, StepResult):  # answered, or no call: the episode ends
            return calls
        outputs, errors = [], 0
        for name, argument in calls:
            try:
                outputs.append(self.tools[name](argument))
            except ToolError as e:
                outputs.append(f"error: {e}")
                errors += 1
        text = "".join(f"\n<result>\n{out}\n</result>\n" for out in outputs)
        obs = encode_text(self.tokenizer, text) if self.obs_format == "inline" else \
            message_ids(self.tokenizer, "user", text.strip("\n"))
        reward = self.call_reward if errors == 0 else 0.0
        return StepResult(obs, reward, False, {"tool_calls": len(calls), "tool_errors": errors})


class SearchEnv(ToolEnv):
    """Fictional-entity QA (`jaxrl.data.entities`): search the world's documents, answer exactly.

    Args:
      tokenizer: the model's tokenizer.
      corpus_seed, corpus_size: which world to search (`build_world(seed, size)`); records come from
        `World.records(split)` of the same world.
      top_k: documents per search.
      obs_format, call_reward: as `ToolEnv`.
      demo_search: the share of questions whose demonstration searches (`oracle_actions`); the others are
        demonstrated by `guess_actions`, an answer without searching. Below 1 the warm start leaves a policy
        that mostly guesses, and RL has to discover that searching pays (as the quickstart's mixed styles).
      query_with_question: search "question question query" instead of the query alone, so that a model that
        cannot copy the name out of the question (a tiny character-level one) still retrieves the right
        document; the question counts twice in BM25, so a query naming another person (a memorised training
        name) cannot tie with it.
      instructions: the user message's text before "Question: …" (`SEARCH_INSTRUCTIONS` by default).
    """

    def __init__(self, tokenizer, *, corpus_seed: int = 0, corpus_size: str = "tiny", top_k: int = 1,
                 obs_format: str = "inline", call_reward: float = 0.0, demo_search: float = 1.0,
                 query_with_question: bool = False, instructions: str = SEARCH_INSTRUCTIONS):
        if not 0.0 <= float(demo_search) <= 1.0:
            raise ValueError(f"demo_search must be in [0, 1], got {demo_search}")
        world = _world(int(corpus_seed), str(corpus_size))
        self.world, self.demo_search = world, float(demo_search)
        self.query_with_question, self.question = bool(query_with_question), ""
        super().__init__(tokenizer, tools=("search",),
                         instructions=instructions,
                         obs_format=obs_format, call_reward=call_reward,
                         tool_kwargs={"search": {"contents": world.contents, "top_k": top_k}})

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        self.question = str(record.get("question", ""))
        if "chain" in record:  # a generated record (`World.records`): it must be a question of this world
            key = (self.question, tuple(str(a) for a in record.get("answers", ())))
            if key not in _questions(self.world.seed, self.world.size):
                raise EnvError(
                    f"{type(self).__name__}.reset: the record {self.question!r} (answers {list(key[1])}) is "
                    f"not a question of the env's world (corpus_seed={self.world.seed}, corpus_size="
                    f"{self.world.size!r}): its data comes from another corpus; give env.params the data's "
                    "corpus_seed and corpus_size")
        return super().reset(record)

    def step(self, action: Action) -> StepResult:
        if not self.query_with_question:
            return super().step(action)
        q = self.question
        text = re.sub(r"<search>(.*?)</search>", lambda m: f"<search>{q} {q} {m.group(1)}</search>",
                      action.text, flags=re.DOTALL)
        return super().step(dataclasses.replace(action, text=text))

    def demonstration(self, record: Mapping[str, Any]) -> list[str]:
        """The action texts the SFT warm start imitates for `record`: `oracle_actions` (a correct episode)
        for a `demo_search` share of questions (chosen by crc32 of the question), else `guess_actions`."""
        if _unit(f"search:{record['question']}") < self.demo_search:
            return oracle_actions(record)
        return guess_actions(record, self.world)


@functools.lru_cache(maxsize=4)
def _world(seed: int, size: str):
    return build_world(seed, size)


@functools.lru_cache(maxsize=4)
def _questions(seed: int, size: str) -> frozenset[tuple[str, tuple[str, ...]]]:
    return frozenset((q["question"], tuple(map(str, q["answers"]))) for q in _world(seed, size).questions)


def _unit(text: str) -> float:
    """A deterministic number in [0, 1) for `text` (crc32; no salted hashing)."""
    return zlib.crc32(text.encode()) / 2**32


def _template(record: Mapping[str, Any]) -> str:
    return str(record["question"]).replace(str(record["chain"][0]), "{}")


@functools.lru_cache(maxsize=4)
def _answer_pools(seed: int, size: str) -> dict[str, tuple[str, ...]]:
    pools: dict[str, set[str]] = {}
    for q in _world(seed, size).questions:
        pools.setdefault(_template(q), set()).add(q["answers"][0])
    return {t: tuple(sorted(v)) for t, v in pools.items()}


def guess_actions(record: Mapping[str, Any], world) -> list[str]:
    """An answer without searching: one of the answers the world gives to questions of the record's form
    (the question with its first chain name taken out), chosen by crc32 of the question, so the guesses are
    spread evenly over the values. Its accuracy is the no-search baseline (about 1/16 in the lookup world)."""
    pool = _answer_pools(world.seed, world.size)[_template(record)]
    return [f"<answer>{pool[zlib.crc32(('guess:' + record['question']).encode()) % len(pool)]}</answer>"]


def oracle_actions(record: Mapping[str, Any]) -> list[str]:
    """The demonstration policy: search each entity of the record's chain in order, then answer."""
    searches = [f"<search>{name}</search>" for name in record["chain"]]
    return searches + [f"<answer>{record['answers'][0]}</answer>"]


def demonstrations(tokenizer, *, corpus_seed: int = 0, corpus_size: str = "tiny", split: str = "train",
                   top_k: int = 1, max_total_tokens: int = 2048, row_buckets: Sequence[int] = (2048,)):
    """SFT warm-start rows: `oracle_actions` played through `SearchEnv` on a split of the world's questions.

    Returns `jaxrl.envs.Episodes` (one per question): tokens as sampling would lay them out, loss mask on
    the demonstrated actions only (never on the search results), reward 1 on every row.
    """
    from jaxrl.envs.episodes import EpisodeBudget, scripted_episodes  # episodes imports nothing from here

    records = _world(int(corpus_seed), str(corpus_size)).records(split)
    budget = EpisodeBudget(max_turns=4, max_total_tokens=max_total_tokens, row_buckets=tuple(row_buckets))

    def factory(tok):
        return SearchEnv(tok, corpus_seed=corpus_seed, corpus_size=corpus_size, top_k=top_k)

    return scripted_episodes(records, tokenizer, factory, oracle_actions, budget)
