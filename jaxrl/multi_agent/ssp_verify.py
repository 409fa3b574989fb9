"""SSP's RAG check (spec/multi-agent.md §2.5, rule 7): who answers a proposed question from its noisy materials.

A proposal that passed the text rules is valid only if a verifier, shown the question and the proposal's own
search results mixed with other proposals' results (`ssp_text.noisy_materials`), answers a*. Three verifiers,
chosen by `SspSystem(rag_verifier=...)`:

* `"policy"` (the paper, arXiv:2510.18821 §3: the Solver answers from the materials without searching): the
  policy being trained, greedy, one turn. It lives in `SspSystem.verify` (it needs the run's parameters). A
  verifier that is also the Proposer can learn to pass its own questions: the check co-evolves with what it
  checks.
* `"rule"` (`RuleVerifier`): a frozen rule-based check over the world: it answers a question the world has
  (its text, normalised) when every document of the question's chain is among the materials, and reads the
  answer in the chain's last document; any other question gets no answer. Strict (a correct question in other
  words is rejected), deterministic, free.
* a judge spec (`JudgeVerifier`, the reference's verifier: Alibaba-Quark/SSP `_validate_with_external_llm`, an
  LLM behind an endpoint): `{model: PATH, ...}`, a frozen local model (a jaxrl run or checkpoint, or an HF
  directory: `jaxrl.rewards.judges.local_judge`), or `{generate: "module:function"}` (requests -> replies, e.g.
  an inference-server client). The prompt asks for the answer after "Answer:" as the reference's does; the
  reply's answer is its last `<answer>` tag, else the rest of the line after the first case-insensitive
  "Answer" (optional ASCII or full-width colon), as the reference reads it. Greedy (the reference samples at
  temperature 0.1: greedy keeps runs reproducible), at most 70 new tokens unless the spec says otherwise (the
  reference's budget). A judge that gives no reply, or raises, rejects the question (the reference accepts
  it: spec §2.5's listed deviation, since accepting unverified questions poisons the curriculum). The
  reference's second chance, an LLM match-judge for answers that fail the exact match, is not run.
"""

from __future__ import annotations

import logging
import re
import string
from typing import Any, Mapping, Sequence

from jaxrl.data.entities import World

log = logging.getLogger(__name__)

VERIFIERS = ("policy", "rule")  # or a judge spec mapping
JUDGE_MAX_NEW_TOKENS = 70  # the reference's verifier budget
_DOC = re.compile(r"Doc \d+ \(Title: ([^)\n]+)\)\n(.*?)(?=\n+Doc \d+ \(Title: |\Z)", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"answer\s*[:：]?\s*(.*)", re.IGNORECASE)


def judge_text(materials: str, question: str) -> str:
    """The judge's request (the reference's instruction, paraphrased): materials, question, answer after
    "Answer:"."""
    return (f"Materials:\n{materials}\n\nQuestion: {question}\nAnswer the question from the materials. Reason "
            "in about 50 words at most, then give the answer on a line of its own after 'Answer:'.")


def reply_answer(reply: str | None) -> str | None:
    """A verifier reply's answer: the last `<answer>` tag's text, else the rest of the line after the first
    case-insensitive "Answer" (optional colon); None when there is neither (or no reply)."""
    if reply is None:
        return None
    tags = _ANSWER_TAG.findall(reply)
    if tags:
        return tags[-1].strip()
    found = _ANSWER_LINE.search(reply)
    return found.group(1).splitlines()[0].strip() if found else None


def _normalise(text: str) -> str:
    """Lower case, punctuation dropped, whitespace collapsed (the question matcher of `RuleVerifier`)."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.split())


def documents(materials: str) -> dict[str, str]:
    """{title: text} of the search results in a materials text (`jaxrl.envs.tools.format_results` blocks)."""
    return {title.strip(): text.strip() for title, text in _DOC.findall(materials)}


class RuleVerifier:
    """Answers the world's own questions from the materials (module docstring).

    Args:
      world: the searched world (`jaxrl.data.entities.build_world`); every split's questions are known.
    """

    def __init__(self, world: World):
        self.by_text: dict[str, Mapping[str, Any]] = {}
        for q in world.questions:
            self.by_text.setdefault(_normalise(str(q["question"])), q)

    def answer(self, materials: str, question: str) -> str | None:
        known = self.by_text.get(_normalise(question))
        if known is None:
            return None
        docs = documents(materials)
        if not all(name in docs for name in known["chain"]):
            return None  # the evidence is not in the materials
        answer = str(known["answers"][0])
        return answer if answer in docs[known["chain"][-1]] else None

    def answers(self, materials: Sequence[str], questions: Sequence[str]) -> list[str | None]:
        return [self.answer(m, q) for m, q in zip(materials, questions)]


class JudgeVerifier:
    """A frozen judge model, or the user's text generator, reads the materials (module docstring).

    Args:
      spec: a judge spec, `{model: PATH, max_new_tokens, batch_size, dtype, chat}` or `{generate:
        "module:function"}` (`jaxrl.rewards.judges.local_judge.check_judge_spec`; checked by the caller).
    """

    def __init__(self, spec: Mapping[str, Any]):
        from jaxrl.rewards.judges.local_judge import text_generator

        spec = dict(spec)
        if "model" in spec:
            spec.setdefault("max_new_tokens", JUDGE_MAX_NEW_TOKENS)
        self.generate = text_generator(spec)
        self.name = spec.get("model") or spec.get("generate")

    def answers(self, materials: Sequence[str], questions: Sequence[str]) -> list[str | None]:
        requests = [judge_text(m, q) for m, q in zip(materials, questions)]
        try:
            replies = list(self.generate(requests))
        except Exception as e:  # noqa: BLE001 - a failed judge rejects, it does not stop the run
            log.warning("SSP RAG judge %s failed (%s: %s); its %d questions are rejected", self.name,
                        type(e).__name__, e, len(requests))
            return [None] * len(requests)
        if len(replies) != len(requests):
            log.warning("SSP RAG judge %s gave %d replies for %d requests; the questions are rejected",
                        self.name, len(replies), len(requests))
            return [None] * len(requests)
        return [reply_answer(r if isinstance(r, str) else None) for r in replies]


def make_verifier(spec: Any, world: World) -> RuleVerifier | JudgeVerifier | None:
    """The verifier for `rag_verifier` (None: the policy, run by `SspSystem.verify`); raises ValueError
    naming the allowed values for anything else."""
    if isinstance(spec, Mapping):
        from jaxrl.rewards.judges.local_judge import check_judge_spec

        check_judge_spec(spec, "rag_verifier")
        return JudgeVerifier(spec)
    if spec == "policy":
        return None
    if spec == "rule":
        return RuleVerifier(world)
    raise ValueError(f"rag_verifier={spec!r}: allowed values are 'policy', 'rule', or a judge "
                     "{model: PATH} / {generate: 'module:function'}")
