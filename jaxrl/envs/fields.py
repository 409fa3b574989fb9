"""`FieldsEnv`: look one field of a person up with a tool, then answer it (configs/agentic_rl_tiny.yaml).

The world is `build_world(seed, "fields")` or "fields4" (`jaxrl.data.entities.build_field_world`): a person has F
fields (room, desk, gate, …) whose values are distinct one-character codes found nowhere else in an
episode. A question asks one field ("What is the desk of Nidem?"). The model writes `<get>field</get>`, the
turn stops at the closing tag and the environment appends that field's line of the asked person

    \\n<result>\\ndesk: 7\\n</result>\\n

(inline, as `SearchEnv`); `<answer>7</answer>` ends the episode with reward 1 for an exact match, else 0.
`demonstration` queries a field drawn uniformly (by crc32 of the question), not the asked one, and answers
the code it read; with `demo_tool` < 1 the other demonstrations answer a guessed code without the tool. So
the SFT warm start teaches the tool syntax, the answer format and copying a result, never which field to ask
(a wrong field's code is always wrong): imitating the demonstrations scores about demo_tool/F + (1 -
demo_tool)/16, and a greedy policy that guesses 1/16. RL has to learn to call the tool and to query the
field the question names. `right_field` (a reward function, weight 0 in the config: a metric) scores
whether an episode's first query was the asked field.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

from jaxrl.data.entities import _ROOMS as CODES
from jaxrl.data.entities import FIELD_NAMES, build_world
from jaxrl.envs.base import Action, StepResult, encode_text, prompt_ids
from jaxrl.envs.search import _unit, end_or_calls
from jaxrl.envs.tools import find_calls
from jaxrl.errors import EnvError

TOOL = "get"


@functools.lru_cache(maxsize=4)
def _world(seed: int, size: str):
    world = build_world(seed, size)
    if not all("field" in q for q in world.questions):
        raise ValueError(f"corpus_size={size!r}: not a fields world (its questions ask no field); use 'fields'")
    return world, {q["question"]: q for q in world.questions}


class FieldsEnv:
    """Answer a question about one field of a person, read with `<get>field</get>`; reward = exact match.

    Args:
      tokenizer: the model's tokenizer.
      corpus_seed, corpus_size: the world (`build_world(seed, size)`, a fields world); the data must be
        `data.source: entities` with the same `corpus_seed` and `corpus_size`.
      instructions: text before the question in the user message ("" : the question alone).
      demo_right_field: the share of questions whose demonstration queries the asked field (by crc32 of the
        question); the others query a uniformly drawn field. 0 (default): the demonstrations never teach
        which field to ask.
      demo_tool: the share of questions whose demonstration calls the tool (by crc32 of the question); the
        others answer a code drawn uniformly without calling it (`guess`), as often right as not calling
        the tool at all (1/16).
    """

    stop_strings = (f"</{TOOL}>", "</answer>")

    def __init__(self, tokenizer, *, corpus_seed: int = 0, corpus_size: str = "fields", instructions: str = "",
                 demo_right_field: float = 0.0, demo_tool: float = 1.0):
        for name, share in (("demo_right_field", demo_right_field), ("demo_tool", demo_tool)):
            if not 0.0 <= float(share) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {share}")
        self.demo_tool = float(demo_tool)
        self.world, self.questions = _world(int(corpus_seed), str(corpus_size))
        first = next(iter(self.world.entities.values()))
        self.fields = tuple(k for k in FIELD_NAMES if k in first)
        self.tokenizer, self.instructions = tokenizer, str(instructions)
        self.demo_right_field = float(demo_right_field)
        self.person: Mapping[str, Any] = {}
        self.answers: list[str] = []

    def _question(self, record: Mapping[str, Any]) -> Mapping[str, Any]:
        q = self.questions.get(str(record.get("question", "")))
        if q is None:
            raise EnvError(
                f"{type(self).__name__}.reset: the record {record.get('question')!r} is not a question of the "
                f"env's world (corpus_seed={self.world.seed}, corpus_size={self.world.size!r}); give the data "
                "(data.source: entities) and env.params the same corpus_seed and corpus_size")
        return q

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        q = self._question(record)
        self.person, self.answers = self.world.entities[q["chain"][0]], [str(a) for a in q["answers"]]
        user = f"{self.instructions}\n{q['question']}" if self.instructions else q["question"]
        return prompt_ids(self.tokenizer, [{"role": "user", "content": user}])

    def step(self, action: Action) -> StepResult:
        calls = end_or_calls(action, self.answers, (TOOL,), 1)
        if isinstance(calls, StepResult):  # answered, or no call: the episode ends
            return calls
        field = calls[0][1].strip()
        ok = field in self.fields
        out = f"{field}: {self.person[field]}" if ok else "error: unknown field"  # never echo a bad argument
        obs = encode_text(self.tokenizer, f"\n<result>\n{out}\n</result>\n")
        return StepResult(obs, 0.0, False, {"tool_calls": 1, "tool_errors": int(not ok), "field": field})

    def demonstration(self, record: Mapping[str, Any]) -> list[str]:
        """The action texts the SFT warm start imitates: for a `demo_tool` share of questions, query a field
        (uniform, or the asked one for a `demo_right_field` share; `demo_field`), then answer the code that
        field holds; for the others, answer a guessed code (`guess`)."""
        q = self._question(record)
        if _unit(f"fields-tool:{q['question']}") >= self.demo_tool:
            return [f"<answer>{guess(q)}</answer>"]
        field = demo_field(q, self.fields, self.demo_right_field)
        return [f"<{TOOL}>{field}</{TOOL}>", f"<answer>{self.world.entities[record['chain'][0]][field]}</answer>"]


def demo_field(question: Mapping[str, Any], fields: Sequence[str], right_share: float = 0.0) -> str:
    """The field a demonstration queries: the asked one for a `right_share` of questions, else one of
    `fields` drawn uniformly (both by crc32 of the question, so a replayed warm start sees the same)."""
    if _unit(f"fields-right:{question['question']}") < right_share:
        return str(question["field"])
    return fields[int(_unit(f"fields:{question['question']}") * len(fields))]


def guess(question: Mapping[str, Any]) -> str:
    """A code drawn uniformly from the 16 (by crc32 of the question): the no-tool answer."""
    return CODES[int(_unit(f"fields-guess:{question['question']}") * len(CODES))]


def asked_field(question: str) -> str:
    """The field a question names: "What is the desk of Nidem?" -> "desk"."""
    return str(question).removeprefix("What is the ").partition(" of ")[0]


def right_field(prompts: Sequence[str], completions: Sequence[str], question: Sequence[str]) -> list[float]:
    """1 where the episode's first `<get>` call names the field its question asks, else 0 (no call: 0).

    A reward function (`rewards: - {name: right_field, function: "jaxrl.envs.fields:right_field", weight:
    0}`): with weight 0 it changes no advantage and is logged as `reward/right_field/mean` and, on the
    held-out questions, `eval/reward/right_field/mean`.
    """
    out = []
    for text, q in zip(completions, question):
        calls = find_calls(text, (TOOL,))
        out.append(float(bool(calls) and calls[0][1].strip() == asked_field(q)))
    return out
