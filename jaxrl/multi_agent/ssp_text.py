"""SSP's text rules: the Proposer's and verifier's prompts and the extraction of a proposed problem.

"Search Self-Play", arXiv:2510.18821 (reference: Alibaba-Quark/SSP, `problem_extraction.py`); spec/multi-agent.md
§2.5, rules 1-6 and 8 (the RAG check, rule 7, needs the policy: `jaxrl.multi_agent.ssp_verify`). Pure string
functions of a transcript; the loop that uses them is `jaxrl.multi_agent.ssp`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

import numpy as np

_QUESTION = re.compile(r"<question>(.*?)</question>", re.DOTALL)
_RESULT = re.compile(r"<result>\n?(.*?)\n?</result>", re.DOTALL)
_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# The reference's clean-up of an extracted question (`problem_extraction.py`, `extract_problems`): stray
# answer tags anywhere (also "<\\answer>"), then a dangling "</" or "</answer" at the end.
_STRAY_TAGS = (re.compile(r"<\\?/?answer\s*>"), re.compile(r"</\s*$"), re.compile(r"</answer\s*$"))
MAX_QUESTION_CHARS = 1000  # the reference's upper bound on a question's length (characters, stripped)
RULES = ("reference", "v1")


SHORT_SOLVER_INSTRUCTIONS = "Search, then answer."


def proposer_text(answer: str, hops: int, short: bool = False) -> str:
    """The Proposer's user text (spec §2.2, paraphrased and shortened): the answer and the search count
    (`short`: without the tags' syntax, which the demonstrations teach)."""
    if short:
        return f"Write a question whose answer is {answer} ({hops} search)."
    return (f"Write a question whose answer is {answer}, needing {hops} search(es). Search with "
            f"<search>name</search>, then write <question>...</question>.")


def verifier_text(materials: str, question: str) -> str:
    """The RAG check's prompt: materials and question only (no search, single turn)."""
    return f"Materials:\n{materials}\nAnswer from the materials: <answer>...</answer>\nQuestion: {question}"


@dataclasses.dataclass(frozen=True)
class Problem:
    """A proposed question after extraction: `valid` is False with the first failed rule in `reason`."""

    question: str | None
    materials: str
    searches: tuple[str, ...]
    valid: bool
    reason: str


def leaks(answer: str, question: str, mode: str = "substring") -> bool:
    """Rule 4: a* (lower-cased) in the question, as a substring (reference) or as a whole word ("word": for
    one-character answers such as the rooms world's codes, which any question contains as a letter)."""
    a, q = answer.lower(), question.lower()
    if mode == "word":
        return re.search(rf"(?<!\w){re.escape(a)}(?!\w)", q) is not None
    return a in q


def names_a_title(question: str, materials: str) -> bool:
    """The question names (as whole words) the title of a document in its materials."""
    titles = re.findall(r"\(Title: ([^)\n]+)\)", materials)
    return any(re.search(rf"(?<!\w){re.escape(t.strip())}(?!\w)", question) for t in titles if t.strip())


def search_terms(transcript: str, expand_lists: bool = True) -> tuple[str, ...] | None:
    """The search terms of a transcript, stripped. `expand_lists` (the reference's rule): a search whose text
    is a JSON list counts each non-empty item as a term (`<search>["a", "b"]</search>` is two searches);
    None when such a list holds a non-string (the reference's extraction fails on it: no problem)."""
    terms: list[str] = []
    for raw in _SEARCH.findall(transcript):
        text = raw.strip()
        try:
            items = json.loads(text) if expand_lists else None
        except ValueError:
            items = None
        if not isinstance(items, list):
            terms.append(text)
        elif not all(isinstance(t, str) for t in items):
            return None
        else:
            terms += [t.strip() for t in items if t.strip()]
    return tuple(terms)


def clean_question(text: str) -> str:
    """The reference's clean-up of a question (`_STRAY_TAGS`) after stripping; not stripped again (the
    reference counts the words of the cleaned text as it is)."""
    q = text.strip()
    for pattern in _STRAY_TAGS:
        q = pattern.sub("", q)
    return q


def extract_problem(transcript: str, answer: str, *, min_searches: int, min_words: int,
                    leak: str = "substring", grounded: bool = False, rules: str = "reference") -> Problem:
    """Rules of spec §2.5 (1-6, 8) in order; the RAG check (7) is the caller's (it needs the policy).
    `grounded` adds a rule after 6 (not the reference's): the question names a document title of its
    materials (`names_a_title`).

    rules="reference" (Alibaba-Quark/SSP `ProblemExtractor._is_valid_search_question`): stray answer tags
    are cleaned from the question, which must have 10 to `MAX_QUESTION_CHARS` characters and `min_words`
    words counted by `split(" ")` (so "a  b" is three); JSON search lists are expanded (`search_terms`).
    rules="v1" (jaxrl before issue 28, kept for configs/ssp_tiny.yaml, whose results were measured with
    it): no clean-up, no upper length bound, words split on any whitespace, each search text one term."""
    if rules not in RULES:
        raise ValueError(f"rules={rules!r}: allowed values are {', '.join(map(repr, RULES))}")
    ref = rules == "reference"
    found = _QUESTION.search(transcript)
    materials = "\n\n".join(m.strip() for m in _RESULT.findall(transcript) if m.strip())
    terms = search_terms(transcript, expand_lists=ref)
    searches = () if terms is None else terms
    if found is None or terms is None:
        q = None if found is None else found.group(1).strip()
        return Problem(q, materials, searches, False, "format")
    q = clean_question(found.group(1)) if ref else found.group(1).strip()
    words = len(q.split(" ")) if ref else len(q.split())
    q = q.strip()
    if len(q) < 10 or (ref and len(q) > MAX_QUESTION_CHARS) or words < min_words:
        return Problem(q, materials, searches, False, "length")
    if leaks(answer, q, leak):
        return Problem(q, materials, searches, False, "leak")
    if not materials:
        return Problem(q, materials, searches, False, "materials")
    if len(searches) < min_searches or len(set(searches)) != len(searches):
        return Problem(q, materials, searches, False, "searches")
    if grounded and not names_a_title(q, materials):
        return Problem(q, materials, searches, False, "grounded")
    return Problem(q, materials, searches, True, "ok")


def noisy_materials(own: str, others: Sequence[str], key: int, max_others: int = 4) -> str:
    """This episode's materials with up to `max_others` distinct other ones, order a function of `key`."""
    pool = sorted({m for m in others if m and m != own})
    rng = np.random.default_rng(key)
    picked = [pool[i] for i in rng.permutation(len(pool))[:max_others]] if pool else []
    parts = picked + [own]
    return "\n\n".join(parts[i] for i in rng.permutation(len(parts)))
