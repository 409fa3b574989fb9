"""The fictional-entity world: deterministic per seed, fast, unique names, no leaked answers, and every
question answerable by searching its chain (an oracle run through the real SearchEnv scores 1)."""

import re
import time

import numpy as np
import pytest

from jaxrl.data.entities import build_world
from jaxrl.envs import EpisodeBudget, Search, make_env, oracle_actions, scripted_episodes
from jaxrl.envs.search import demonstrations
from jaxrl.io.tokenizer import builtin_tokenizer


@pytest.mark.serial  # a wall-clock bound: tests/suite.py runs it alone
def test_same_seed_same_world_and_fast():
    t0 = time.perf_counter()
    a = build_world(7)
    assert time.perf_counter() - t0 < 0.5
    b = build_world(7)
    assert a.docs == b.docs and a.questions == b.questions
    assert build_world(8).docs != a.docs
    assert [d["id"] for d in a.docs] == [f"d{i:06d}" for i in range(len(a.docs))]
    assert all(len(d["contents"]) < 300 for d in a.docs)  # short: one token per character in tests


def test_names_unique_and_answers_not_leaked():
    w = build_world(1)
    titles = [d["contents"].split("\n")[0] for d in w.docs]
    assert len(set(titles)) == len(titles)
    hops = {q["hops"] for q in w.questions}
    assert hops == {1, 2, 3}
    for q in w.questions:
        assert q["answers"][0].lower() not in q["question"].lower()
    train, ev = w.records("train"), w.records("eval")
    assert len(train) + len(ev) == len(w.questions) and not {q["id"] for q in train} & {q["id"] for q in ev}


def test_twins_differ_from_their_originals_in_a_number():
    w = build_world(2)
    titles = [d["contents"].split("\n")[0] for d in w.docs]
    twins = titles[len(w.entities):]
    assert twins
    for twin in twins:
        head, _, last = twin.rpartition(" ")
        originals = [t for t in titles[: len(w.entities)]
                     if t.rpartition(" ")[0] == head and len(t) == len(twin)
                     and sum(x != y for x, y in zip(t, twin)) == 1]
        assert len(originals) == 1, twin
        nums = lambda title: re.findall(r"\d[\d,]*", w.docs[titles.index(title)]["contents"])  # noqa: E731
        assert nums(twin) != nums(originals[0])


def test_every_chain_hop_is_retrieved_first():
    w = build_world(0)
    search = Search(w.contents, top_k=1)
    titles = [d["contents"].split("\n")[0] for d in w.docs]
    for q in w.questions:
        for k, name in enumerate(q["chain"]):
            top = search.index.search(name, 1)
            assert top == [titles.index(name)], (q["question"], name)
            nxt = q["chain"][k + 1] if k + 1 < len(q["chain"]) else q["answers"][0]
            assert nxt in w.docs[top[0]]["contents"]


def test_oracle_answers_every_question_through_the_env():
    tok = builtin_tokenizer()
    w = build_world(0)
    factory = make_env("search", {"corpus_seed": 0, "top_k": 1}, tokenizer=tok)
    spec = EpisodeBudget(max_turns=4, max_total_tokens=2048)
    ep = scripted_episodes(list(w.questions), tok, factory, oracle_actions, spec)
    np.testing.assert_array_equal(ep.rewards_B, 1.0)
    hops = np.asarray([q["hops"] for q in w.questions])
    np.testing.assert_array_equal(ep.tool_calls_B, hops)
    np.testing.assert_array_equal(ep.turns_B, hops + 1)
    assert ep.tool_errors_B.sum() == 0 and ep.finished_B.all()
    # a wrong answer scores 0
    wrong = scripted_episodes(list(w.questions[:3]), tok, factory, lambda r: ["<answer>Nowhere</answer>"],
                              spec)
    np.testing.assert_array_equal(wrong.rewards_B, 0.0)


def test_demonstrations_are_rewarded_rows_with_actions_masked_in():
    tok = builtin_tokenizer()
    demo = demonstrations(tok, corpus_seed=0, split="eval")
    assert len(demo.records) == len(build_world(0).records("eval"))
    np.testing.assert_array_equal(demo.rewards_B, 1.0)
    for n in range(3):
        acts = tok.decode(demo.tokens_BL[n][demo.loss_mask_BL[n]])
        assert acts == "".join(oracle_actions(demo.records[n]))
        assert "<result>" in demo.completions[n] and "<result>" not in acts
