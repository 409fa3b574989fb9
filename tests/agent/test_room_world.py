"""The rooms world (`build_world(seed, "rooms")`) behind configs/search_tiny.yaml: a one-letter answer at the
end of a one-line document, unguessable without searching; and `query_with_question` retrieving the asked
person's document even when the model's query names another (memorised) person."""

import collections

import numpy as np

from jaxrl.data.entities import build_world
from jaxrl.envs import EpisodeBudget, make_env, oracle_actions, scripted_episodes
from jaxrl.envs.search import guess_actions, normalize_answer
from jaxrl.io.tokenizer import builtin_tokenizer

SPEC = EpisodeBudget(max_turns=3, max_total_tokens=512)


def test_room_world_is_deterministic_with_one_letter_answers_at_the_end_of_its_document():
    w = build_world(0, "rooms")
    assert build_world(0, "rooms").docs == w.docs and build_world(1, "rooms").docs != w.docs
    names = [q["chain"][0] for q in w.questions]
    assert len(set(names)) == len(names) == len(w.docs) == 600
    for q, doc in zip(w.questions, w.contents):
        name, room = q["chain"][0], q["answers"][0]
        assert q["question"] == f"What is the room of {name}?"
        assert doc == f"{name}\n{name} has room {room}." and len(room) == 1
        assert normalize_answer(room) == room.lower()  # never an article that normalisation would drop
        # the code is the only character of its kind in the episode (prompt, query, "Doc 1 (Title: ...)")
        assert room not in q["question"] + doc[:-2] + "Search with name then reply answer Doc 1 (Title: )"
    rooms = collections.Counter(q["answers"][0] for q in w.records("train"))
    assert len(rooms) == 16 and max(rooms.values()) < 3 * min(rooms.values())


def test_searching_answers_every_room_question_and_guessing_few():
    tok = builtin_tokenizer()
    w = build_world(0, "rooms")
    factory = make_env("search", {"corpus_size": "rooms", "query_with_question": True}, tokenizer=tok)
    held_out = w.records("eval")
    oracle = scripted_episodes(held_out, tok, factory, oracle_actions, SPEC)
    np.testing.assert_array_equal(oracle.rewards_B, 1.0)
    guess = scripted_episodes(held_out, tok, factory, lambda r: guess_actions(r, w), SPEC)
    assert guess.tool_calls_B.sum() == 0 and 0.0 < guess.rewards_B.mean() < 0.15  # about 1/16
    majority = collections.Counter(q["answers"][0] for q in held_out).most_common(1)[0][1] / len(held_out)
    assert majority < 0.15


def test_query_with_question_beats_a_query_naming_another_person():
    tok = builtin_tokenizer()
    w = build_world(0, "rooms")
    qs = list(w.questions[:80])
    other = {q["question"]: qs[(i + 1) % len(qs)]["chain"][0] for i, q in enumerate(qs)}
    # the model's query is another real person's name (as a memorised training name would be): the question
    # must still win; with the question counted once, BM25 ties and document order picks half of them wrong
    actions = lambda r: [f"<search>{other[r['question']]}</search>", "<answer>x</answer>"]  # noqa: E731
    factory = make_env("search", {"corpus_size": "rooms", "query_with_question": True}, tokenizer=tok)
    ep = scripted_episodes(qs, tok, factory, actions, SPEC)
    texts = [tok.decode(ep.tokens_BL[i][ep.mask_BL[i]]) for i in range(len(qs))]
    assert all(f"(Title: {r['chain'][0]})" in t for r, t in zip(qs, texts))
