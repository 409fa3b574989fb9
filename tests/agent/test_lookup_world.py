"""The lookup world (`build_world(seed, "lookup")`, configs/search_tiny.yaml's before the rooms world) and
SearchEnv's mixed demonstrations (`demo_search`): held-out questions are about unseen people, their answers
come from values seen in training, guessing without searching scores near chance, and searching answers
every question."""

import collections

import numpy as np
import pytest

from jaxrl.data.entities import build_world
from jaxrl.envs import EpisodeBudget, make_env, oracle_actions, scripted_episodes
from jaxrl.envs.search import SearchEnv, guess_actions
from jaxrl.io.tokenizer import builtin_tokenizer


def test_lookup_world_is_deterministic_and_held_out_needs_search():
    w = build_world(0, "lookup")
    assert build_world(0, "lookup").docs == w.docs and build_world(1, "lookup").docs != w.docs
    names = [q["chain"][0] for q in w.questions]
    assert len(set(names)) == len(names) == len(w.docs)  # one question a person
    assert all(len(n) == 5 and n[0].isupper() for n in names)
    assert all(q["question"].endswith(f" {q['chain'][0]}?") for q in w.questions)
    train, held_out = w.records("train"), w.records("eval")
    seen = {q["chain"][0] for q in train}
    assert not seen & {q["chain"][0] for q in held_out}
    train_values = collections.defaultdict(set)
    for q in train:
        train_values[q["attribute"]].add(q["answers"][0])
    for q in held_out:  # never a value the model could not have seen as a training answer
        assert q["answers"][0] in train_values[q["attribute"]]
        assert q["answers"][0].lower() not in q["question"].lower()
    # no-search baseline: always answering the most common held-out value of each form scores little
    by_form = collections.defaultdict(list)
    for q in held_out:
        by_form[q["attribute"]].append(q["answers"][0])
    majority = sum(collections.Counter(v).most_common(1)[0][1] for v in by_form.values()) / len(held_out)
    assert majority < 0.15


def test_searching_answers_every_lookup_question_and_guessing_few():
    tok = builtin_tokenizer()
    w = build_world(0, "lookup")
    factory = make_env("search", {"corpus_seed": 0, "corpus_size": "lookup", "top_k": 1}, tokenizer=tok)
    spec = EpisodeBudget(max_turns=3, max_total_tokens=512)
    qs = list(w.questions)
    ep = scripted_episodes(qs, tok, factory, oracle_actions, spec)
    np.testing.assert_array_equal(ep.rewards_B, 1.0)
    guess = scripted_episodes(qs, tok, factory, lambda r: guess_actions(r, w), spec)
    assert guess.tool_calls_B.sum() == 0
    assert 0.0 < guess.rewards_B.mean() < 0.15  # about 1/16: 16 values a form


def test_demo_search_mixes_oracle_and_guess_demonstrations():
    tok = builtin_tokenizer()
    w = build_world(0, "lookup")
    mixed = SearchEnv(tok, corpus_size="lookup", demo_search=0.25)
    demos = [mixed.demonstration(q) for q in w.questions]
    searched = np.mean([d[0].startswith("<search>") for d in demos])
    assert 0.18 < searched < 0.32
    for q, d in zip(w.questions, demos):
        assert d == oracle_actions(q) or d == guess_actions(q, w)
        assert mixed.demonstration(q) == d  # a function of the question
    full = SearchEnv(tok, corpus_size="lookup")  # the default: every demonstration searches (as before)
    assert all(full.demonstration(q) == oracle_actions(q) for q in w.questions[:50])
    with pytest.raises(ValueError, match="demo_search"):
        SearchEnv(tok, corpus_size="lookup", demo_search=1.5)


def test_query_with_question_retrieves_the_right_document_for_any_query():
    tok = builtin_tokenizer()
    w = build_world(0, "lookup")
    qs = list(w.questions[:60])
    spec = EpisodeBudget(max_turns=3, max_total_tokens=512)
    wrong = lambda r: ["<search>Ferim</search>", f"<answer>{r['answers'][0]}</answer>"]  # noqa: E731
    for flag, expected in ((False, 0.0), (True, 1.0)):
        params = {"corpus_size": "lookup", "query_with_question": flag}
        ep = scripted_episodes(qs, tok, make_env("search", params, tokenizer=tok), wrong, spec)
        # the answer is always right here; only the observation differs: the garbage query alone finds
        # nothing ("No results."), with the question it finds the person's own document
        texts = [tok.decode(ep.tokens_BL[i][ep.mask_BL[i]]) for i in range(len(qs))]
        found = np.mean([f"(Title: {r['chain'][0]})" in t for r, t in zip(qs, texts)])
        assert found == expected
