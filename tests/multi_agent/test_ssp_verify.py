"""SSP's RAG check by a verifier apart from the policy (issue 29 item 4): `rag_verifier: rule` and a judge.

The pipeline runs on scripted episodes (no policy: `SspSystem.verify` must not need one for these verifiers)
over the real environments and BM25 search, as in test_ssp_system.py.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl.data.entities import build_world
from jaxrl.envs.episodes import EpisodeBudget, scripted_episodes
from jaxrl.envs.tools import format_results
from jaxrl.errors import ConfigError
from jaxrl.io import model_io
from jaxrl.io.tokenizer import builtin_tokenizer
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.multi_agent import make_system
from jaxrl.multi_agent.ssp import DUMMY, ROLE_IDS, SspSystem
from jaxrl.multi_agent.ssp_envs import proposer_demonstration
from jaxrl.multi_agent.ssp_verify import JudgeVerifier, RuleVerifier, judge_text, reply_answer
from jaxrl.rewards.judges.local_judge import generate_texts
from jaxrl.sampling import SamplingSpec

ROOMS = dict(corpus_seed=0, corpus_size="rooms_copy", top_k=1, min_words=4, min_searches=None, leak="word",
             query_with_question=True, proposer_query="answer", rag_others=1, max_total_tokens=384)


def code_judge(requests):
    """A judge that reads the materials: the code of the person the question names ("The room of X is K."),
    no reply when the materials do not say."""
    out = []
    for r in requests:
        name = re.search(r"Question: What is the room of (\w+)\?", r).group(1)
        found = re.search(rf"The room of {name} is (\w)\.", r)
        out.append(f"The materials say so.\nAnswer: {found.group(1)}" if found else None)
    return out


def broken_judge(requests):
    raise ConnectionError("endpoint down")


def test_reply_answer_reads_a_tag_or_the_reference_answer_line():
    assert reply_answer("x <answer>7</answer> y <answer> 9 </answer>") == "9"
    assert reply_answer("It is in doc 2.\nAnswer: Kiapark\nmore") == "Kiapark"
    assert reply_answer("reasoning\nanswer：1172") == "1172"  # full-width colon, any case
    assert reply_answer("no verdict here") is None and reply_answer(None) is None


def test_rule_verifier_answers_world_questions_only_from_their_evidence():
    world = build_world(0, "tiny")
    rule = RuleVerifier(world)
    two_hop = next(q for q in world.questions if q["hops"] == 2)
    by_name = {c.partition("\n")[0]: c for c in world.contents}
    chain_docs = [by_name[n] for n in two_hop["chain"]]
    other = next(c for c in world.contents if c.partition("\n")[0] not in two_hop["chain"])
    materials = format_results([other, *chain_docs])
    assert rule.answer(materials, two_hop["question"]) == two_hop["answers"][0]
    # normalised text: case and punctuation do not matter
    assert rule.answer(materials, two_hop["question"].upper().rstrip("?")) == two_hop["answers"][0]
    # the evidence must be in the materials: without the chain's first document there is no answer
    assert rule.answer(format_results([other, chain_docs[1]]), two_hop["question"]) is None
    # a question the world does not have (a garbled name, other words) gets no answer
    q = two_hop["question"]
    assert rule.answer(materials, q.replace(two_hop["chain"][0], two_hop["chain"][0] + "x")) is None
    assert rule.answer(materials, "Tell me something about " + two_hop["chain"][0]) is None


def _collect(system: SspSystem, records, proposer, g=2):
    def episodes(name, graphdef, params, recs, factory, spec, gg, key):
        budget = EpisodeBudget(max_turns=system.max_turns, max_total_tokens=system.max_total_tokens)
        solver = lambda rec: [f"<answer>{rec['answers'][0]}</answer>"]  # noqa: E731
        return scripted_episodes(recs, system.tokenizer, factory, proposer if name == "proposer" else solver,
                                 budget, group_size=gg)

    system._episodes = episodes
    # graphdef and params None: a verifier apart from the policy never touches the policy
    return system.collect(None, None, records, None, SamplingSpec(max_new_tokens=48, num_samples=g),
                          jax.random.key(0))


def _proposals(records):
    """Record 0 asks its own question (answer a*); record 1 asks record 2's question (its answer is not
    record 1's a*, although the rules pass); record 2 asks its own."""
    wrong = {records[1]["question"]: records[2]["question"]}

    def proposer(rec):
        acts = proposer_demonstration(rec, "answer")
        q = wrong.get(rec["question"])
        return acts[:-1] + [f"<question>{q}</question>"] if q else acts
    return proposer


@pytest.mark.parametrize("verifier", ["rule", {"generate": f"{__name__}:code_judge"}])
def test_separate_verifier_rejects_a_question_whose_answer_is_not_a_star(verifier):
    tok = builtin_tokenizer()
    system = SspSystem(tok, **ROOMS, rag_verifier=verifier, failed_slots="dummy")
    world = build_world(0, "rooms_copy")
    records = [q for q in world.records("train")][:3]
    assert len({r["answers"][0] for r in records}) == 3  # distinct codes: asking another's question is wrong
    ro = _collect(system, records, _proposals(records))
    m = ro.metrics
    assert m["ssp/valid_frac"] == pytest.approx(2 / 3) and m["ssp/rag_rejected"] == pytest.approx(1 / 3)
    n_p = len(records)
    solver_qs = [r["question"] for r in ro.records[n_p:]]
    assert solver_qs == [records[0]["question"]] * 2 + [DUMMY] * 2 + [records[2]["question"]] * 2
    np.testing.assert_array_equal(ro.segment_B[:n_p], ROLE_IDS["proposer"])


def test_rule_verifier_needs_the_evidence_among_the_noisy_materials():
    """A question about a person whose document no proposal read: the rule gives no answer (rejected,
    counted in ssp/rag_unanswered), where the policy might guess it."""
    tok = builtin_tokenizer()
    world = build_world(0, "rooms_copy")
    records = [q for q in world.records("train")][:2]
    unseen = world.records("eval")[0]  # no record's search returns this person
    wrong = {records[1]["question"]: unseen["question"]}

    def proposer(rec):
        acts = proposer_demonstration(rec, "answer")
        q = wrong.get(rec["question"])
        return acts[:-1] + [f"<question>{q}</question>"] if q else acts

    system = SspSystem(tok, **ROOMS, rag_verifier="rule", failed_slots="dummy")
    m = _collect(system, records, proposer).metrics
    assert m["ssp/rag_rejected"] == pytest.approx(1 / 2) and m["ssp/rag_unanswered"] == pytest.approx(1 / 2)


def test_a_failing_judge_rejects_every_question_it_was_asked(caplog):
    tok = builtin_tokenizer()
    world = build_world(0, "rooms_copy")
    records = [q for q in world.records("train")][:2]
    system = SspSystem(tok, **ROOMS, rag_verifier={"generate": f"{__name__}:broken_judge"}, failed_slots="dummy")
    with caplog.at_level("WARNING"):
        m = _collect(system, records, lambda rec: proposer_demonstration(rec, "answer")).metrics
    assert m["ssp/valid_frac"] == 0.0 and m["ssp/rag_rejected"] == 1.0 and m["ssp/rag_unanswered"] == 1.0
    assert any("endpoint down" in r.getMessage() for r in caplog.records)


def test_frozen_model_judge_reads_the_reference_prompt_greedily(tmp_path):
    """`{model: PATH}`: a frozen local model (here a random tiny one) is asked the judge prompt, greedily, with
    the reference's 70-token budget; its verdicts are the exact match of its replies' answers."""
    tok = builtin_tokenizer()
    cfg = TransformerConfig.tiny(vocab_size=len(tok), num_layers=1, max_position_embeddings=1024,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    path = str(model_io.save_model_checkpoint(Transformer(cfg, rngs=nnx.Rngs(0)), tmp_path / "judge",
                                              tokenizer=tok))
    judge = JudgeVerifier({"model": path, "batch_size": 2})
    world = build_world(0, "rooms_copy")
    mats = [format_results([world.contents[i]]) for i in range(3)]
    qs = [f"What is the room of {world.contents[i].partition(chr(10))[0]}?" for i in range(3)]
    replies = generate_texts([judge_text(m, q) for m, q in zip(mats, qs)], model=path, max_new_tokens=70,
                             batch_size=2)
    assert all(r is not None for r in replies)
    assert judge.answers(mats, qs) == [reply_answer(r) for r in replies]
    assert judge.answers(mats, qs) == judge.answers(mats, qs)  # frozen and greedy


@pytest.mark.parametrize("value, says", [
    ("oracle", "allowed values are 'policy', 'rule'"),
    ({"model": "/no/such/judge"}, "rag_verifier.model='/no/such/judge': does not exist"),
    ({"generate": "no_such_module_xyz:f"}, "rag_verifier.generate"),
])
def test_bad_rag_verifier_is_a_config_error_naming_it(value, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        make_system("ssp", {"rag_verifier": value}, builtin_tokenizer())
