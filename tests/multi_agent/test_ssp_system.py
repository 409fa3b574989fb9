"""SSP skeleton (jaxrl.multi_agent.ssp) with scripted episodes: no model, every action chosen by the test.

`SspSystem._episodes` is replaced by `jaxrl.envs.scripted_episodes` on the real environments (searches are
served by BM25 over the world), so extraction, validity, the dummy problems, the rewards of
`losses.research.ssp` and the role rows are checked on transcripts the test controls.
"""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

from jaxrl.data.tasks import entities
from jaxrl.envs.episodes import EpisodeBudget, scripted_episodes
from jaxrl.multi_agent.roles import row_roles
from jaxrl.multi_agent.ssp import DUMMY, ROLE_IDS, SspSystem
from jaxrl.multi_agent.ssp_envs import proposer_demonstration
from jaxrl.multi_agent.ssp_text import extract_problem, noisy_materials
from jaxrl.sampling import SamplingSpec
from jaxrl.io.tokenizer import load_tokenizer


# The entity world's 1-hop questions ("When was Bubris founded?") have 4-6 words and need one search: the
# pipeline tests below take the rules configs/ssp_tiny.yaml pins, not the reference's 10 words and 2 searches.
SHORT = {"min_words": 4, "min_searches": None}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin")


def scripted(system: SspSystem, proposer_policy, solver_policy):
    def episodes(name, graphdef, params, records, factory, spec, g, key):
        del spec  # scripted actions: no sampling
        es = EpisodeBudget(max_turns=system.max_turns, max_total_tokens=system.max_total_tokens)
        return scripted_episodes(records, system.tokenizer, factory,
                                 proposer_policy if name == "proposer" else solver_policy, es, group_size=g)
    return episodes


def collect_scripted(system: SspSystem, records, g: int):
    """One collect call where record 1's Proposer writes no question tag (invalid: a dummy problem) and the
    Solver is right on record 0's problems only."""
    bad = records[1]["question"]

    def proposer(rec):
        acts = proposer_demonstration(rec)
        return acts[:-1] + ["no question"] if rec["question"] == bad else acts

    def solver(rec):
        first = rec["question"] == records[0]["question"]
        return [f"<answer>{rec['answers'][0] if first else 'nothing'}</answer>"]

    system._episodes = scripted(system, proposer, solver)
    return system.collect(None, None, records, None, SamplingSpec(max_new_tokens=64, num_samples=g),
                          jax.random.key(0))


def test_extract_problem_rules_in_order():
    ok = "<search>Bubris</search>\n<result>\nBubris\nfounded 1173\n</result>\n<question>When was Bubris founded?"
    ok += "</question>"
    p = extract_problem(ok, "1173", min_searches=1, min_words=4)
    assert p.valid and p.question == "When was Bubris founded?" and p.searches == ("Bubris",)
    assert extract_problem("no tags", "1173", min_searches=1, min_words=4).reason == "format"
    assert extract_problem(ok, "1173", min_searches=1, min_words=6).reason == "length"
    assert extract_problem(ok, "bubris", min_searches=1, min_words=4).reason == "leak"
    assert extract_problem(ok, "1173", min_searches=2, min_words=4).reason == "searches"
    # grounded (not the reference's rule): the question must name a document title of its materials
    real = ("<search>Bubris</search>\n<result>\nDoc 1 (Title: Bubris)\nBubris was founded in 1173.\n</result>\n"
            "<question>When was Bubris founded?</question>")
    garbled = real.replace("<question>When was Bubris", "<question>When was Bubri")
    assert extract_problem(garbled, "1173", min_searches=1, min_words=4).valid  # the reference's rules
    assert extract_problem(garbled, "1173", min_searches=1, min_words=4, grounded=True).reason == "grounded"
    assert extract_problem(real, "1173", min_searches=1, min_words=4, grounded=True).valid
    no_result = "<search>Bubris</search><question>When was Bubris founded?</question>"
    assert extract_problem(no_result, "1173", min_searches=1, min_words=4).reason == "materials"
    twice = "<search>A</search><search>A</search>" + ok
    assert extract_problem(twice, "1173", min_searches=1, min_words=4).reason == "searches"


def test_noisy_materials_keep_own_and_at_most_four_others():
    others = ["m1", "m2", "m3", "m4", "m5", "own", "m1"]
    text = noisy_materials("own", others, key=3)
    parts = text.split("\n\n")
    assert "own" in parts and len(parts) == 5 and len(set(parts)) == 5


def test_collect_rewards_rows_and_curriculum(tok):
    g = 2
    system = SspSystem(tok, rag_check=False, max_total_tokens=768, proposer_samples=g, **SHORT)
    records = [r for r in entities(200, 0, max_hops=1)][:3]
    ro = collect_scripted(system, records, g)
    n_p, n_s = len(records) * g, len(records) * g * g
    np.testing.assert_array_equal(row_roles(ro), [ROLE_IDS["proposer"]] * n_p + [ROLE_IDS["solver"]] * n_s)
    solver_qs = [r["question"] for r in ro.records[n_p:]]
    assert solver_qs[:g * g] == [records[0]["question"]] * (g * g)
    assert solver_qs[g * g:2 * g * g] == [DUMMY] * (g * g)
    r_s = ro.rewards_BR[n_p:, 0]
    np.testing.assert_allclose(r_s, [1.0] * (g * g) + [0.0] * (2 * g * g))
    # R_p = 1 - success of its problem; the invalid proposal gets the format penalty (0 here)
    np.testing.assert_allclose(ro.rewards_BR[:n_p, 0], [0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    assert ro.metrics["ssp/valid_frac"] == pytest.approx(4 / 6)
    assert ro.metrics["ssp/invalid/format"] == pytest.approx(2 / 6)
    assert ro.metrics["ssp/solver_success"] == pytest.approx(0.5)
    # each role is its own segment with its own group size
    np.testing.assert_array_equal(ro.segment_B, row_roles(ro))
    assert ro.segment_sizes == (g, g)
    # observation tokens (search results) are never trained
    for i, text in enumerate(ro.completions[:n_p]):
        if "<result>" in text:
            w = ro.prompt_width
            trained = tok.decode(ro.tokens_BL[i, w:][ro.completion_mask_BT[i]], skip_special_tokens=True)
            assert "<result>" not in trained and "<search>" in trained


def test_demonstration_env_serves_searches(tok):
    system = SspSystem(tok)
    records = entities(40, 0, max_hops=1)[:8]
    factory = system.demonstration_env
    es = EpisodeBudget(max_turns=4, max_total_tokens=768)
    probe = factory(tok)
    eps = scripted_episodes(records, tok, factory, probe.demonstration, es)
    kinds = {"<question>" in c for c in eps.completions}
    assert kinds == {True, False}  # both roles are demonstrated
    assert all("<result>" in c for c in eps.completions)  # the searches were served


def test_proposer_group_of_one_by_default_gives_a_equal_r(tok):
    """Reference (Alibaba-Quark/SSP): one question per answer record, so the Proposer's GRPO group has one
    row and its advantage is its reward (verl: mean 0, scale 1); the Solver's G rows form their own groups."""
    from jaxrl.algorithms import ALGORITHMS, AlgoSettings, segment_advantages

    system = SspSystem(tok, rag_check=False, max_total_tokens=768, format_penalty=-1.0, **SHORT)
    assert system.group_sizes(4) == {"proposer": 1, "solver": 4}
    records = entities(200, 0, max_hops=1)[:3]
    g = 2
    ro = collect_scripted(system, records, g)
    n_p = len(records)
    roles = [ROLE_IDS["proposer"]] * n_p + [ROLE_IDS["solver"]] * n_p * g
    np.testing.assert_array_equal(row_roles(ro), roles)
    assert ro.segment_sizes == (1, g)
    r_p = ro.rewards_BR[:n_p, 0]
    np.testing.assert_allclose(r_p, [0.0, -1.0, 1.0])  # 1 - solver success; invalid: the format penalty
    s = AlgoSettings(group_size=g, eps=1e-6, clip_low=0.2, clip_high=0.2, section=None)
    adv = segment_advantages(ALGORITHMS["grpo"].advantages, ro.rewards_BR, ro.weights_R,
                             ro.completion_mask_BT, s, ro.segment_B, ro.segment_sizes)
    for i in range(n_p):
        trained = ro.completion_mask_BT[i]
        np.testing.assert_allclose(adv.adv_BT[i][trained], r_p[i] / (1 + 1e-6), rtol=1e-6)


def test_problem_pool_draws_eligible_problems_and_clears():
    from jaxrl.multi_agent.ssp_pool import ProblemPool

    pool = ProblemPool(threshold=0.5, clear_every=3, clear_offset=0, fallback_any=False)
    assert pool.fill([False, True], key=0) == [None, None]  # empty: the caller's dummy
    pool.push([("q easy", "a1", 1.0), ("q hard", "a2", 0.25)])
    picks = pool.fill([False, True, False, False], key=1)
    assert picks[1] is None and all(p["question"] == "q hard" for p in picks if p is not None)  # 1.0 > 0.5
    assert [p is None for p in picks] == [False, True, False, False]
    same = ProblemPool(threshold=0.5, clear_every=3, clear_offset=0, fallback_any=False)
    same.load_state(pool.state_json())
    assert same.fill([False] * 5, key=7) == pool.fill([False] * 5, key=7) and same.steps == 1
    pool.push([])
    pool.push([("q3", "a3", 0.0)])  # offset 0 (v1): the third step clears (keep_ratio 0)
    assert pool.problems == [] and pool.steps == 3


def test_pool_clears_at_the_reference_step():
    """Alibaba-Quark/SSP `fit`: the step counter starts at 1 and is advanced before `global_steps % interval
    == 0`, so with interval 10 the pool is cleared after steps 9, 19, 29 (jaxrl v1: 10, 20, 30)."""
    from jaxrl.multi_agent.ssp_pool import ProblemPool

    def cleared_after(pool):
        out = []
        for step in range(1, 31):
            pool.push([(f"q{step}", "a", 0.0)])
            if not pool.problems:
                out.append(step)
        return out

    assert ProblemPool().clear_offset == 1
    assert cleared_after(ProblemPool(clear_every=10)) == [9, 19, 29]
    assert cleared_after(ProblemPool(clear_every=10, clear_offset=0)) == [10, 20, 30]
    assert cleared_after(ProblemPool(clear_every=1)) == list(range(1, 31))
    assert cleared_after(ProblemPool(clear_every=0)) == []
    tok = load_tokenizer("builtin")
    assert SspSystem(tok).pool.clear_offset == 1 and SspSystem(tok, rules="v1").pool.clear_offset == 0


def test_pool_falls_back_to_any_problem_when_none_is_eligible():
    """The reference's `get_problems_by_success_rate`: no problem at or below the threshold, a non-empty pool:
    a random pool problem (v1: the dummy)."""
    from jaxrl.multi_agent.ssp_pool import ProblemPool

    tok = load_tokenizer("builtin")
    ref, v1 = SspSystem(tok, reuse_threshold=0.5).pool, SspSystem(tok, reuse_threshold=0.5, rules="v1").pool
    for pool in (ref, v1):
        pool.push([("q solved", "a1", 1.0), ("q also", "a2", 0.75)])
    picks = ref.fill([False, True, False], key=3)
    assert picks[1] is None and {p["question"] for p in picks if p} <= {"q solved", "q also"}
    assert all(p is not None for p in (picks[0], picks[2]))
    assert v1.fill([False, True, False], key=3) == [None, None, None]
    ref.push([("q hard", "a3", 0.25)])  # an eligible problem exists: only it is drawn
    assert {p["question"] for p in ref.fill([False] * 6, key=4)} == {"q hard"}
    assert ProblemPool().fill([False], key=0) == [None]  # an empty pool: the dummy


def test_failed_slots_reuse_earlier_problems_and_resume_exactly(tok):
    system = SspSystem(tok, rag_check=False, max_total_tokens=768, format_penalty=-1.0, **SHORT)
    records = entities(200, 0, max_hops=1)[:3]
    g = 2
    first = collect_scripted(system, records, g)  # record 1 invalid, empty pool: a dummy problem
    n_p = len(records)
    assert [r["question"] for r in first.records[n_p::g]][1] == DUMMY
    assert first.metrics["ssp/dummy"] == pytest.approx(1 / 3) and first.metrics["ssp/reused"] == 0.0
    assert first.metrics["ssp/pool_size"] == 2.0  # the two valid problems
    saved = system.state_json()
    second = collect_scripted(system, records, g)
    q = [r["question"] for r in second.records[n_p::g]]
    assert q[1] in (records[0]["question"], records[2]["question"])  # an earlier valid problem, reused
    answer = second.records[n_p + g]["answers"][0]
    assert answer == {r["question"]: r["answers"][0] for r in records}[q[1]]  # with its own answer
    assert second.rewards_BR[1, 0] == -1.0  # the failed Proposer still gets the format penalty
    assert second.metrics["ssp/reused"] == pytest.approx(1 / 3) and second.metrics["ssp/dummy"] == 0.0
    resumed = SspSystem(tok, rag_check=False, max_total_tokens=768, format_penalty=-1.0, **SHORT)
    resumed.load_state(saved)
    again = collect_scripted(resumed, records, g)
    assert [r["question"] for r in again.records] == [r["question"] for r in second.records]
    np.testing.assert_array_equal(again.rewards_BR, second.rewards_BR)
    dummy_only = SspSystem(tok, rag_check=False, max_total_tokens=768, failed_slots="dummy", **SHORT)
    assert dummy_only.state_json() is None
    collect_scripted(dummy_only, records, g)
    assert [r["question"] for r in collect_scripted(dummy_only, records, g).records[n_p::g]][1] == DUMMY


def test_rooms_options_leak_word_queries_and_verifier_demos(tok):
    """The rooms world (configs/ssp_tiny.yaml): one-character answers leak only as a word; both roles' searches
    reach the record's document through a garbled name (query_with_question); the warm start demonstrates the
    three roles, the Solver guessing for a share of questions and the verifier reading a* from two documents."""
    from jaxrl.data.entities import build_world
    from jaxrl.multi_agent.ssp_text import leaks

    assert leaks("e", "What is the room of Nidem?") and not leaks("e", "What is the room of Nidem?", "word")
    assert leaks("e", "Is it room E?", "word") and leaks("3", "room 3 of Nidem", "word")
    with pytest.raises(ValueError, match="leak"):
        SspSystem(tok, leak="token")
    records = build_world(0, "rooms").records("train")[:60]
    system = SspSystem(tok, corpus_size="rooms", leak="word", query_with_question=True, solver_demo_search=0.5,
                       verifier_demos=True, rag_others=1, max_total_tokens=384)
    es = EpisodeBudget(max_turns=3, max_total_tokens=384)
    garbled = scripted_episodes(records[:4], tok, system.proposer_env,
                                lambda r: ["<search>Xqzzy</search>", f"<question>{r['question']}</question>"], es)
    for r, c in zip(records[:4], garbled.completions):
        assert f"(Title: {r['chain'][0]})" in c  # the record's own document despite the made-up name
    probe = system.demonstration_env(tok)
    eps = scripted_episodes(records, tok, system.demonstration_env, probe.demonstration, es)
    roles = [probe._role(r) for r in records]
    assert set(roles) == {"proposer", "solver", "verifier"}
    for r, role, c, i in zip(records, roles, eps.completions, range(len(records))):
        a = r["answers"][0]
        if role == "proposer":
            p = extract_problem(c, a, min_searches=1, min_words=4, leak="word")
            assert p.valid and p.question == r["question"]
        elif role == "verifier":
            prompt = tok.decode(eps.tokens_BL[i, :eps.prompt_width], skip_special_tokens=True)
            assert c == f"<answer>{a}</answer>" and prompt.count("(Title: ") == 2
            assert f"{r['chain'][0]} has room {a}." in prompt
    solver = [c for role, c in zip(roles, eps.completions) if role == "solver"]
    searched = sum("<search>" in c for c in solver)
    assert 0 < searched < len(solver)  # solver_demo_search 0.5: some search, the others guess


def test_rooms_copy_world_proposer_query_and_solver_layout_verifier(tok):
    """configs/ssp_tiny.yaml's copy-friendly options: the "rooms_copy" world (three-letter names after "room of ",
    as in the question), Proposer demonstrations that search a* (the name the question needs is then only in
    the search result), the RAG check laid out as a Solver episode whose search result is the materials
    (`rag_layout: solver`), and short prompts (every demonstration row fits 128 + 128 tokens)."""
    import collections

    from jaxrl.data.entities import build_world
    from jaxrl.envs.tools import format_results

    w = build_world(0, "rooms_copy")
    assert w.size == "rooms_copy" and build_world(0, "rooms_copy").docs == w.docs
    names = [q["chain"][0] for q in w.questions]
    assert len(set(names)) == 600 and {len(n) for n in names} == {3}
    assert not {"But", "For", "Not"} & set(names)  # English stopwords: the search would drop them
    for q, doc in zip(w.questions, w.contents):
        name, room = q["chain"][0], q["answers"][0]
        assert doc == f"{name}\nThe room of {name} is {room}." and q["question"] == f"What is the room of {name}?"
        assert room not in q["question"] + doc[:-2] + "Search with name then reply answer Doc 1 (Title: )"
    assert len(collections.Counter(q["answers"][0] for q in w.questions)) == 16
    with pytest.raises(ValueError, match="rag_layout"):
        SspSystem(tok, rag_layout="chat")
    with pytest.raises(ValueError, match="proposer_query"):
        SspSystem(tok, proposer_query="name")
    records = w.records("train")[:60]
    system = SspSystem(tok, corpus_size="rooms_copy", leak="word", query_with_question=True, verifier_demos=True,
                       rag_others=0, rag_layout="solver", proposer_query="answer", short_prompts=True,
                       solver_demo_search=0.5, max_total_tokens=384)
    es = EpisodeBudget(max_turns=3, max_total_tokens=384, row_buckets=(128, 256, 384))
    probe = system.demonstration_env(tok)
    eps = scripted_episodes(records, tok, system.demonstration_env, probe.demonstration, es)
    assert eps.tokens_BL.shape[1] == 256  # prompt and completion buckets of 128
    roles = [probe._role(r) for r in records]
    assert set(roles) == {"proposer", "solver", "verifier"}
    for i, (r, role, c) in enumerate(zip(records, roles, eps.completions)):
        name, a = r["chain"][0], r["answers"][0]
        prompt = tok.decode(eps.tokens_BL[i, :eps.prompt_width], skip_special_tokens=True)
        if role == "proposer":  # searches the answer, reads the record's person, asks the world's question
            assert c.startswith(f"<search>{a}</search>\n<result>\nDoc 1 (Title: {name})\n")
            p = extract_problem(c, a, min_searches=1, min_words=4, leak="word")
            assert p.valid and p.question == r["question"] and name not in p.searches[0]
        elif role == "verifier":  # the Solver's prompt, then the materials as a search result
            solver_prompt = tok.decode(system.solver_env(tok).reset(r), skip_special_tokens=True)
            assert solver_prompt.startswith("Search, then answer.\nQuestion: ")
            result = format_results([f"{name}\nThe room of {name} is {a}."])
            assert prompt.endswith(f"{solver_prompt}\n<result>\n{result}\n</result>\n")
            assert c == f"<answer>{a}</answer>"
    ids = system.verifier_ids("Doc 1 (Title: Kop)\nThe room of Kop is 7.", "What is the room of Kop?")
    assert tok.decode(ids, skip_special_tokens=True).endswith("The room of Kop is 7.\n</result>\n")


def _reference_is_valid(transcript: str, answer: str) -> bool:
    """A transcription of Alibaba-Quark/SSP `ProblemExtractor` (LLM judge and search-term filter off, their
    defaults), with jaxrl's tags: the first `<question>` (`answer_pattern="question"`) and `<result>` for the
    reference's `<information>`. A list item that is not a string raises there: no problem is extracted."""
    found = list(re.finditer(r"<question>\s*(.*?)\s*</question>", transcript, re.DOTALL))
    if not found:
        return False
    q = found[0].group(1).strip()
    q = re.sub(r"<\\?/?answer\s*>", "", q)
    q = re.sub(r"</\s*$", "", q)
    q = re.sub(r"</answer\s*$", "", q)
    if not q or len(q.strip()) < 10 or len(q.strip()) > 1000 or len(q.split(" ")) < 10:
        return False
    if answer.lower() in q.lower():
        return False
    if not re.findall(r"<result>(.*?)</result>", transcript, re.DOTALL):
        return False
    terms = []
    for raw in re.findall(r"<search>\s*(.*?)\s*</search>", transcript, re.DOTALL):
        try:
            loaded = json.loads(raw)
        except ValueError:
            terms.append(raw.strip())
            continue
        if isinstance(loaded, list):
            try:
                terms.extend(t.strip() for t in loaded if t.strip())
            except AttributeError:
                return False
        else:
            terms.append(raw.strip())
    return len(terms) > 1 and len(terms) == len(set(terms))


def _random_transcript(rng) -> tuple[str, str]:
    names = ["Bubris", "Tarn", "Ode", "Kop", "1173", "Bubris Tarn"]
    parts = []
    for _ in range(int(rng.integers(0, 4))):
        kind = rng.integers(0, 4)
        if kind == 0:
            parts.append(f"<search>{rng.choice(names)}</search>")
        elif kind == 1:  # a JSON list, maybe with duplicates or an empty item
            items = [str(rng.choice(names + [""])) for _ in range(int(rng.integers(1, 4)))]
            parts.append("<search>" + json.dumps(items) + "</search>")
        elif kind == 2:
            parts.append(f"<search> {rng.choice(names)} \n</search>")
        else:
            parts.append(f"<search>[{int(rng.integers(0, 9))}, \"Kop\"]</search>" if rng.random() < 0.3
                         else "<search>\"Ode\"</search>")
        parts.append("<result>\nDoc 1 (Title: Bubris)\nBubris was founded in 1173.\n</result>")
    words = [str(rng.choice(["When", "was", "the", "town", "of", "Bubris", "founded", "by", "Tarn", "?"]))
             for _ in range(int(rng.integers(3, 14)))]
    seps = [str(rng.choice([" ", " ", " ", "  ", "\n"])) for _ in words]
    question = "".join(w + s for w, s in zip(words, seps)).strip()
    if rng.random() < 0.1:
        question = (question + " ") * 80  # past 1000 characters
    tail = str(rng.choice(["", "", "</answer>", "</", " </answer", "<answer>"]))
    if rng.random() < 0.8:
        parts.append(f"<question>{question}{tail}</question>")
    answer = str(rng.choice(["1173", "founded", "Zq"]))
    return "\n".join(parts), answer


def test_extraction_matches_the_reference_rules_on_random_transcripts():
    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(3000):
        text, answer = _random_transcript(rng)
        got = extract_problem(text, answer, min_searches=2, min_words=10)
        assert got.valid == _reference_is_valid(text, answer), (text, answer, got)
        kinds.add(got.reason)
    assert kinds == {"ok", "format", "length", "leak", "materials", "searches"}  # every rule was exercised


def test_reference_rules_by_hand():
    materials = "<result>\nDoc 1 (Title: Bubris)\nBubris was founded in 1173.\n</result>\n"
    q10 = "In which year was the old town of Bubris founded, Tarn?"  # 11 words
    one = f"<search>Bubris</search>\n{materials}<question>{q10}</question>"
    assert extract_problem(one, "1173", min_searches=2, min_words=10).reason == "searches"  # 1-hop, 1 search
    listed = f"<search>[\"Bubris\", \"Tarn\"]</search>\n{materials}<question>{q10}</question>"
    p = extract_problem(listed, "1173", min_searches=2, min_words=10)
    assert p.valid and p.searches == ("Bubris", "Tarn")
    assert extract_problem(listed, "1173", min_searches=2, min_words=10, rules="v1").reason == "searches"
    dup = listed.replace('"Tarn"', '"Bubris"')
    assert extract_problem(dup, "1173", min_searches=2, min_words=10).reason == "searches"
    stray = listed.replace("Tarn?</question>", "Tarn?</answer></question>")  # cleaned, as the reference
    assert extract_problem(stray, "1173", min_searches=2, min_words=10).question == q10
    v1 = extract_problem(stray, "1173", min_searches=2, min_words=10, rules="v1")
    assert v1.question == q10 + "</answer>"
    newline = listed.replace("was the old", "was\nthe\nold")  # split(" "): 9 words; split(): 11
    assert extract_problem(newline, "1173", min_searches=2, min_words=10).reason == "length"
    assert extract_problem(newline, "1173", min_searches=1, min_words=10, rules="v1").valid
    long_q = "word " * 199 + "a" * 6  # 1001 characters
    long_t = f"<search>[\"Bubris\", \"Tarn\"]</search>\n{materials}<question>{long_q}</question>"
    assert len(long_q) == 1001
    assert extract_problem(long_t, "1173", min_searches=2, min_words=10).reason == "length"
    assert extract_problem(long_t.replace("aaaaaa", "aaaaa"), "1173", min_searches=2, min_words=10).valid
    assert extract_problem(long_t, "1173", min_searches=1, min_words=10, rules="v1").valid
    system = SspSystem(load_tokenizer("builtin"))
    assert (system.min_words, system.min_searches, system.rules) == (10, 2, "reference")
