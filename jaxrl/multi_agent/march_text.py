"""MARCH's texts: the three roles' prompts, their parsers, and the fictional-entity passages with distractors.

MARCH, arXiv:2603.24579; formats of spec/multi-agent.md §1.2-1.5 (paraphrased, shortened for a
character-level tiny model; no reference text copied):

    Solver    user: "Passages:\\nDoc 1: …\\nDoc 2: …\\nQuestion: {query}\\n" -> free answer
    Proposer  user: query + the Solver's *answer part*                    -> "- Question: q [Answer: n]"
    Checker   user: the passages + the numbered question texts            -> "k. Evidence: … [Answer: n]"

Information asymmetry (the point of the method, spec §1.2): `checker_text` takes the passages and the
question texts only; nothing of the Solver's response or the Proposer's answers can reach it.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Mapping, Sequence

PROPOSER_TASK = "Ask for each number of the response: - Question: q [Answer: n]"
CHECKER_TASK = "Answer from the materials only (else Cannot answer): k. Evidence: doc [Answer: n]"
FACT_LABEL = "rag_for_digit_fact"

# The reference's pair rule (`_extract_qa_pairs`): the whitespace around the question and the answer may span
# newlines ("- Question:\n q\n[Answer: n]"), the texts themselves may not. `_PAIR_V1`: jaxrl before issue 28,
# a pair on one line (configs/march_tiny.yaml keeps it).
_PAIR = re.compile(r"-\s*Question:\s*([^\n]*?)\s*\[Answer:\s*([^\n]*?)\]")
_PAIR_V1 = re.compile(r"-\s*Question:([^\n]*?)\[Answer:([^\n]*?)\]")
RULES = ("reference", "v1")
_ITEM = re.compile(r"(\d+)\.\s*Evidence:(.*?)\[Answer:(.*?)\]", re.DOTALL)
_BLOCK = re.compile(r"Passages:[ \t]*\n(.*?)\nQuestion:([^\n]*)", re.DOTALL)
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_CODE = re.compile(r"(?<!\S)(\S)\.$")  # a one-character answer ending its passage ("... has room C.")


def solver_text(passages: Sequence[str], query: str) -> str:
    """The Solver's user text: a `Passages:` block (one `Doc i:` line per passage) then `Question:`."""
    docs = "\n".join(f"Doc {i + 1}: {p}" for i, p in enumerate(passages))
    return f"Passages:\n{docs}\nQuestion: {query}\n"


def parse_solver_prompt(text: str) -> tuple[str, str]:
    """(passages, query) cut out of a decoded Solver prompt (spec §1.5): the block after `Passages:` and a
    newline, up to the next line starting with `Question:`, and the rest of that line (a trailing
    `assistant` of the chat template removed). A missing block gives empty strings."""
    m = _BLOCK.search(text)
    if m is None:
        return "", ""
    query = m.group(2).strip()
    if query.endswith("assistant"):
        query = query[: -len("assistant")].strip()
    return m.group(1), query


def answer_part(text: str) -> str:
    """The text after `</think>` when there is exactly one `<think>\\n…\\n</think>` block, else all of it."""
    if text.count("<think>") == 1 and text.count("</think>") == 1 and "<think>\n" in text \
            and "\n</think>" in text:
        return text.split("</think>", 1)[1]
    return text


def proposer_text(query: str, answer: str, *, task: str = PROPOSER_TASK) -> str:
    """The Proposer's user text: the instruction line `task` (none when empty), the query and the Solver's
    answer part (never the passages)."""
    head = f"{task}\n" if task else ""
    return f"{head}User Query: {query}\nModel Response: {answer}"


def checker_text(passages: str, questions: Sequence[str], *, task: str = CHECKER_TASK) -> str:
    """The Checker's user text: the instruction line `task` (none when empty), the passages and the question
    texts, `- Question {k}:{text}` (k from 1).

    The signature is the information barrier: no Solver response, no Proposer answer (`task` is the run's
    fixed instruction)."""
    listed = "\n".join(f"- Question {k + 1}:{q}" for k, q in enumerate(questions))
    head = f"{task}\n" if task else ""
    return f"{head}Reference Materials:\n{passages}\nQuestions:\n{listed}"


def parse_pairs(text: str, max_pairs: int | None = None, rules: str = "reference") -> list[tuple[str, str]]:
    """The Proposer's (question, answer) pairs, stripped, in order; every pair (the reference's rule) or at
    most `max_pairs`. A question or answer text does not span lines; with rules="reference" the whitespace
    around it may, with "v1" the whole pair is on one line."""
    if rules not in RULES:
        raise ValueError(f"rules={rules!r}: allowed values are {', '.join(map(repr, RULES))}")
    pattern = _PAIR if rules == "reference" else _PAIR_V1
    pairs = [(q.strip(), a.strip()) for q, a in pattern.findall(answer_part(text))]
    return pairs if max_pairs is None else pairs[:max_pairs]


def parse_checker(text: str, num_questions: int) -> list[str | None]:
    """The Checker's answer to questions 1..Q (None when item k is missing); later duplicates win.

    A response not starting with "1." gets "1." prepended (the spec's `fixed` option of quirk Q3)."""
    body = text.lstrip()
    if not body.startswith("1."):
        body = "1." + body
    found = {int(k): a.strip() for k, _, a in _ITEM.findall(body)}
    return [found.get(k + 1) for k in range(num_questions)]


def is_numeric(answer: str) -> bool:
    return bool(re.fullmatch(r"\d[\d,]*(?:\.\d+)?", answer.strip()))


def is_code(answer: str) -> bool:
    """A one-character answer (the rooms world's room codes, `jaxrl.data.entities.build_room_world`)."""
    return len(answer.strip()) == 1 and answer.strip().isalnum()


def bare_number(text: str) -> str:
    """A number as the Proposer must write it: no thousands separators."""
    return text.replace(",", "")


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def passages(record: Mapping[str, Any], world, num_distractors: int) -> tuple[list[str], int]:
    """The documents of the record's entity chain plus `num_distractors` distractors, and the index of the
    answering (last chain) document. Distractors are the near-twin documents of the chain's entities when the
    world has them (a name one letter away, other numbers: `jaxrl.data.entities`), then documents of other
    entities of the answering entity's type; order and choice are a function of the question (crc32)."""
    bodies = {d["contents"].split("\n", 1)[0]: d["contents"].split("\n", 1)[1] for d in world.docs}
    chain = list(record["chain"])
    gold = [bodies[name] for name in chain]
    key = _crc(record["question"])
    last = chain[-1]
    kind = world.entities[last]["type"]
    twins = [n for n in bodies if n not in world.entities and _near(n, last)]
    same = sorted(n for n, e in world.entities.items() if e["type"] == kind and n not in chain)
    pool = twins + [same[(key + 7 * i) % len(same)] for i in range(len(same))]
    room = world.entities[last].get("room")
    if room is not None:  # the rooms world: a distractor states another room, for a name of another initial
        pool = [n for n in pool if world.entities[n]["room"] != room and n[0] != last[0]]
    extra = []
    for name in pool:
        if len(extra) == num_distractors:
            break
        if bodies[name] not in extra:
            extra.append(bodies[name])
    docs = gold + extra
    order = sorted(range(len(docs)), key=lambda i: _crc(f"{key}:{i}"))
    shuffled = [docs[i] for i in order]
    return shuffled, order.index(len(gold) - 1)


def _near(a: str, b: str) -> bool:
    """Names of equal length one character apart (a twin's name)."""
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1


def label(record: Mapping[str, Any]) -> str:
    """The fact-check label: numeric and one-character (room code) answers are checked
    (`rag_for_digit_fact`), others are not."""
    gold = str(record["answers"][0])
    return FACT_LABEL if is_numeric(gold) or is_code(gold) else "rag"


def wrong_answer(gold: str, docs: Sequence[str], gold_doc: int, key: int, codes: Sequence[str] = ()) -> str:
    """An answer of the gold answer's kind that a distractor passage states: for a code, the code ending a
    distractor passage; for a number, a distractor's number of the same length. When no distractor states
    one: for a code, a made-up one (a code of `codes` other than gold) when `codes` are given; else gold."""
    if is_code(gold):
        found = [m.group(1) for j, d in enumerate(docs) if j != gold_doc for m in [_CODE.search(d)]
                 if m and m.group(1) != gold]
        if not found:
            found = [c for c in codes if c != gold]
    else:
        found = [n for j, d in enumerate(docs) if j != gold_doc for n in _NUMBER.findall(d)
                 if bare_number(n) != bare_number(gold) and len(bare_number(n)) == len(bare_number(gold))]
    return found[key % len(found)] if found else gold


def solver_wrong(query: str, fraction: float) -> bool:
    """Whether the Solver's demonstration for `query` answers from a distractor: a fixed `fraction` of the
    questions, chosen by crc32 (independent of the role choice, which hashes the bare question)."""
    return _crc(f"solver-wrong:{query}") % 10_000 < round(float(fraction) * 10_000)


def demonstrations(record: Mapping[str, Any], docs: Sequence[str], gold_doc: int, wrong_frac: float = 0.0, *,
                   terse: bool = False, codes: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """Role-format demonstrations of one record: role -> (user text, target text).

    Solver: `<answer>{gold}</answer>`, or, for a `wrong_frac` share of the questions (`solver_wrong`), the
    answer a distractor passage states, or with no distractor a made-up code of `codes` (`wrong_answer`; a
    demonstrated hallucination: headroom for the fact-check reward).
    Proposer: fed an answer that is the gold one or, for one record in two, the one a distractor passage
    states (so it learns to transcribe the Solver's number or code, right or wrong). Checker: the gold
    answer and the passage that states it. `terse`: the Proposer's and Checker's prompts without their
    instruction lines. Records that are not fact-checked (`label`): Solver only."""
    gold = str(record["answers"][0])
    query = record["question"]
    said = wrong_answer(gold, docs, gold_doc, _crc(query), codes) if solver_wrong(query, wrong_frac) else gold
    out = {"solver": (solver_text(docs, query), f"<answer>{said}</answer>")}
    if label(record) != FACT_LABEL:
        return out
    shown = wrong_answer(gold, docs, gold_doc, _crc(query), codes) if _crc(query) % 2 else gold
    task = {"task": ""} if terse else {}
    out["proposer"] = (proposer_text(query, f"<answer>{shown}</answer>", **task),
                       f"- Question: {query} [Answer: {bare_number(shown)}]")
    passages_text = "\n".join(f"Doc {i + 1}: {p}" for i, p in enumerate(docs))
    out["checker"] = (checker_text(passages_text, [query], **task),
                      f"1. Evidence: Doc {gold_doc + 1} [Answer: {bare_number(gold)}]")
    return out
