"""MARCH pipeline (jaxrl.multi_agent.march) with scripted roles: no model, every text chosen by the test.

A scripted policy replaces the sampler (`MarchSystem._generate`): the Solver answers the gold number for
some questions and a distractor's number for others, the Proposer transcribes the Solver's number, the
Checker reads the gold passage. The rewards, role rows, groups and the information barrier are then checked
against `losses.research.march` computed here from the texts.
"""

from __future__ import annotations

import inspect
import re

import jax
import numpy as np
import pytest

from jaxrl import rewards as rewards_lib
from jaxrl.config import RewardSpec
from jaxrl.data.tasks import entities
from jaxrl.losses.research.march import answers_match, fact_check_reward
from jaxrl.multi_agent import march_text as mt
from jaxrl.multi_agent.march import ROLE_IDS, MarchSystem, checker_gold_frac
from jaxrl.multi_agent.roles import role_rows, row_roles
from jaxrl.sampling import Generation, SamplingSpec
from jaxrl.io.tokenizer import load_tokenizer

MARKER = "zqxj"  # a string only the Solver writes: it must never reach a Checker prompt


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin")


def numeric_records(n: int) -> list[dict]:
    recs = [r for r in entities(200, 0, max_hops=1) if mt.is_numeric(r["answer"])]
    return recs[:n]


class Script:
    """The scripted roles; `prompts[role]` records every prompt text each role was shown."""

    def __init__(self, system: MarchSystem, records, wrong: set[int],
                 checker_wrong: tuple[int, int] = (-1, -1)):
        self.system, self.records, self.wrong, self.checker_wrong = system, records, wrong, checker_wrong
        self.prompts: dict[str, list[str]] = {"solver": [], "proposer": [], "checker": []}
        self.solver_answers: list[str] = []

    def solver(self, text: str, p: int, g: int) -> str:
        rec = self.records[p]
        docs, gold = self.system.context(rec)
        number = rec["answer"]
        if (p * 10 + g) in self.wrong:  # a hallucination: a number from the distractor passage
            number = next(n for j, d in enumerate(docs) if j != gold for n in re.findall(r"\d[\d,]*", d)
                          if n.replace(",", "") != rec["answer"].replace(",", ""))
        out = f"<answer>{number}</answer> {MARKER}"
        self.solver_answers.append(out)
        return out

    def proposer(self, text: str) -> str:
        query = re.search(r"User Query: (.*)\n", text).group(1)
        number = re.search(r"<answer>(.*?)</answer>", text).group(1).replace(",", "")
        return f"- Question: {query} [Answer: {number}]\n- Question: How old? [Answer: 7]"

    def checker(self, text: str, chain: int, s: int) -> str:
        m = re.search(r"- Question 1:(.*)", text)
        if m is None:  # a chain without claims: the prompt lists no question
            return "1. Evidence: none [Answer: Cannot answer]"
        q = m.group(1)
        rec = next(r for r in self.records if r["question"] == q)
        ans = rec["answer"].replace(",", "")
        if (chain, s) == self.checker_wrong:
            ans = "Cannot answer"
        return f"1. Evidence: Doc 1 [Answer: {ans}]\n2. Evidence: none [Answer: Cannot answer]"

    def generate(self, name, graphdef, params, ids, spec, samples, key):
        tok = self.system.tokenizer
        texts = []
        for p, prompt in enumerate(ids):
            text = tok.decode(prompt, skip_special_tokens=True)
            self.prompts[name].append(text)
            for s in range(samples):
                if name == "solver":
                    texts.append(self.solver(text, p, s))
                elif name == "proposer":
                    texts.append(self.proposer(text))
                else:
                    texts.append(self.checker(text, p, s))
        return role_rows(name, ids, fake_generation(tok, texts, spec.max_new_tokens), samples, tok,
                         spec.prompt_buckets)


def fake_generation(tok, texts, width) -> Generation:
    rows = [list(tok.encode(t, add_special_tokens=False))[: width - 1] + [tok.eos_token_id] for t in texts]
    tokens = np.full((len(rows), width), tok.pad_token_id, np.int32)
    logp = np.zeros((len(rows), width), np.float32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        logp[i, : len(r)] = -0.5
    lengths = np.asarray([len(r) for r in rows], np.int32)
    return Generation(tokens, lengths, logp, np.ones(len(rows), bool), np.zeros(len(rows), np.int32))


def run_collect(tok, monkeypatch, *, train=True, train_roles=("solver", "checker"), wrong=frozenset(),
                checker_wrong=(-1, -1), g=2, p=3):
    system = MarchSystem(tok, train_roles=train_roles, max_questions=3)
    records = numeric_records(p)
    script = Script(system, records, set(wrong), checker_wrong)
    monkeypatch.setattr(system, "_generate", script.generate)
    rewards = rewards_lib.resolve((RewardSpec(name="answer", type="exact_answer"),))
    spec = SamplingSpec(max_new_tokens=160, num_samples=g, prompt_buckets=(512,))
    ro = system.collect(None, None, records, rewards, spec, jax.random.key(0), train=train)
    return ro, script, records


def test_checker_prompt_structurally_excludes_solver_output(tok, monkeypatch):
    params = inspect.signature(mt.checker_text).parameters
    assert list(params) == ["passages", "questions", "task"]  # task: the run's fixed instruction line
    assert params["task"].kind is inspect.Parameter.KEYWORD_ONLY and params["task"].default == mt.CHECKER_TASK
    _, script, records = run_collect(tok, monkeypatch)
    assert all(MARKER in p for p in script.prompts["proposer"])  # the Proposer does see the answer
    for text in script.prompts["checker"]:
        assert MARKER not in text and "<answer>" not in text and "[Answer:" not in text.split("Questions:")[1]
        assert "Passages:" not in text and "User Query" not in text
    for text, rec in zip(script.prompts["checker"][::2], records):  # the passages are the Solver's
        assert all(d in text for d in MarchSystem(tok).context(rec)[0])


def test_rewards_equal_losses_march_on_scripted_chains(tok, monkeypatch):
    wrong = {0, 11}  # chain (p=0, g=0) and (p=1, g=1) state a distractor's number
    ro, _, records = run_collect(tok, monkeypatch, wrong=wrong, checker_wrong=(2, 1))
    n = 6
    roles = row_roles(ro)
    np.testing.assert_array_equal(roles, [ROLE_IDS["solver"]] * n + [ROLE_IDS["checker"]] * n)
    assert ro.reward_names == ("answer", "fact_check", "hallucination")
    np.testing.assert_array_equal(ro.weights_R, [1.0, 1.0, 0.0])
    # Expected votes from the texts: question 1 holds iff the Solver was right (each Checker reads the gold
    # number; chain 2's sample 1 cannot answer); question 2 ("How old? 7") is always refuted.
    votes = -np.ones((n, 3, 3), np.int32)
    qmask = np.zeros((n, 3), bool)
    qmask[:, :2] = True
    for i in range(n):
        p, g = divmod(i, 2)
        right = (p * 10 + g) not in wrong
        for s in range(3):
            votes[i, s, 0] = 1 if right and (i, s) != (2, 1) else -1
    r_fc = np.asarray(fact_check_reward(votes, qmask, mode="ztr"))
    np.testing.assert_array_equal(r_fc, -np.ones(n))  # question 2 is a fault in every chain
    correct = np.asarray([float((p * 10 + g) not in wrong) for p in range(3) for g in range(2)])
    np.testing.assert_allclose(ro.rewards_BR[:n, 0], correct)
    np.testing.assert_allclose(ro.rewards_BR[:n, 1], r_fc)
    np.testing.assert_allclose(ro.rewards_BR[n:, 1], r_fc)  # the Checker row carries the Solver's r_fc
    np.testing.assert_allclose(ro.rewards_BR[n:, 0], 0.0)
    refuted = np.asarray([1 + ((p * 10 + g) in wrong) for p in range(3) for g in range(2)])
    np.testing.assert_allclose(ro.rewards_BR[:n, 2], refuted / 2)
    assert ro.metrics["march/hallucination_rate"] == pytest.approx(refuted.sum() / (2 * n))
    assert ro.metrics["role/solver/reward/mean"] == pytest.approx((correct + r_fc).mean())
    assert ro.metrics["role/checker/reward/mean"] == pytest.approx(r_fc.mean())
    assert answers_match("1,173", "1173")  # the Proposer's bare numbers match the passages' numbers


def test_error_rate_mode_and_one_claim(tok, monkeypatch):
    system = MarchSystem(tok, mode="error_rate", max_questions=1)  # only "question 1" is checked
    records = numeric_records(2)
    script = Script(system, records, {1})
    monkeypatch.setattr(system, "_generate", script.generate)
    rewards = rewards_lib.resolve((RewardSpec(name="answer", type="exact_answer"),))
    spec = SamplingSpec(max_new_tokens=160, num_samples=2, prompt_buckets=(512,))
    ro = system.collect(None, None, records, rewards, spec, jax.random.key(0))
    np.testing.assert_allclose(ro.rewards_BR[:4, 1], [0.0, -0.1, 0.0, 0.0], atol=1e-7)
    assert ro.metrics["march/hallucination_rate"] == pytest.approx(1 / 4)


def test_row_layout_masks_and_groups(tok, monkeypatch):
    ro, script, _ = run_collect(tok, monkeypatch)
    n = 6
    w = ro.prompt_width
    assert ro.tokens_BL.shape[0] == 2 * n
    assert ro.completion_mask_BT.shape == (2 * n, ro.tokens_BL.shape[1] - w)
    # completion tokens are exactly the decoded texts; the trained Checker row is sample S (the last)
    for i, text in enumerate(ro.completions):
        k = int(ro.lengths_B[i])
        ids = ro.tokens_BL[i, w:w + k]
        assert tok.decode(ids, skip_special_tokens=True) == text
        assert ro.completion_mask_BT[i, :k].all() and not ro.completion_mask_BT[i, k:].any()
        assert (ro.old_logp_BT[i, :k] == -0.5).all()
    assert ro.completions[:n] == script.solver_answers
    # groups are G = 2 consecutive rows of one role and one prompt
    groups = np.asarray(row_roles(ro)).reshape(-1, 2)
    assert (groups == groups[:, :1]).all()
    qs = np.asarray([r["question"] for r in ro.records]).reshape(-1, 2)
    assert (qs == qs[:, :1]).all()


def test_train_roles_and_evaluation_rows(tok, monkeypatch):
    ro, _, _ = run_collect(tok, monkeypatch, train_roles=("checker",))
    assert set(row_roles(ro)) == {ROLE_IDS["checker"]}
    ro, _, _ = run_collect(tok, monkeypatch, train_roles=("solver",))
    assert set(row_roles(ro)) == {ROLE_IDS["solver"]}
    ro, _, _ = run_collect(tok, monkeypatch, train=False)  # evaluation: the Solver's answers only
    assert set(row_roles(ro)) == {ROLE_IDS["solver"]} and len(ro.completions) == 6
    with pytest.raises(ValueError, match="train_roles"):
        MarchSystem(tok, train_roles=("proposer",))


def test_checker_rows_without_claims_are_not_trained(tok, monkeypatch):
    system = MarchSystem(tok)
    records = numeric_records(2)
    script = Script(system, records, set())
    script.proposer = lambda text: "no numbers here"
    monkeypatch.setattr(system, "_generate", script.generate)
    rewards = rewards_lib.resolve((RewardSpec(name="answer", type="exact_answer"),))
    spec = SamplingSpec(max_new_tokens=160, num_samples=2, prompt_buckets=(512,))
    ro = system.collect(None, None, records, rewards, spec, jax.random.key(0))
    assert np.isnan(ro.rewards_BR[4:, 1]).all() and not ro.completion_mask_BT[4:].any()
    np.testing.assert_allclose(ro.rewards_BR[:4, 1], 0.0)  # no claim: r_fc = 0 for the Solver
    assert ro.completion_mask_BT[:4].any(axis=1).all()


def test_parsers_follow_the_spec():
    text = "<|user|>Passages:\nDoc 1: A b.\nDoc 2: C d.\nQuestion: Who? assistant"
    assert mt.parse_solver_prompt(text) == ("Doc 1: A b.\nDoc 2: C d.", "Who?")
    assert mt.parse_solver_prompt("no block") == ("", "")
    assert mt.answer_part("<think>\nx\n</think>\nY") == "\nY"
    assert mt.answer_part("<think>x</think>Y") == "<think>x</think>Y"
    two = "- Question: a?\n[Answer: 1]\n-Question: b? [Answer: 2 ]"
    assert mt.parse_pairs(two) == [("a?", "1"), ("b?", "2")]  # the reference's \s* spans the newline
    assert mt.parse_pairs(two, 1) == [("a?", "1")]
    assert mt.parse_pairs(two, 5, rules="v1") == [("b?", "2")]  # jaxrl v1 (configs/march_tiny.yaml)
    assert mt.parse_checker("Evidence: e [Answer: 4]\n2. Evidence: f\n[Answer: 5]", 3) == ["4", "5", None]
    assert mt.parse_checker("1. Evidence: e [Answer: 4]\n1. Evidence: g [Answer: 6]", 1) == ["6"]


def test_demonstrations_cover_roles_and_distractors(tok):
    system = MarchSystem(tok)
    recs = numeric_records(30)
    shown_wrong = 0
    for rec in recs:
        docs, gold = system.context(rec)
        assert len(docs) == 2 and rec["answer"] in docs[gold]
        demos = system.demonstrations(rec)
        assert set(demos) == {"solver", "proposer", "checker"}
        assert demos["checker"][1].endswith(f"[Answer: {rec['answer'].replace(',', '')}]")
        shown_wrong += f"[Answer: {rec['answer'].replace(',', '')}]" not in demos["proposer"][1]
    assert 0 < shown_wrong < len(recs)  # the Proposer also transcribes wrong numbers
    env = system.demonstration_env(tok)
    ids = env.reset(recs[0])
    role_text = tok.decode(ids, skip_special_tokens=True)
    target = env.demonstration(recs[0])[0]
    assert target.endswith(tok.eos_token)
    demos = system.demonstrations(recs[0]).values()
    assert any(u in role_text and target == t + tok.eos_token for u, t in demos)


def test_rooms_world_passages_labels_and_wrong_solver_demonstrations(tok):
    """configs/march_tiny.yaml's world: the distractor states another room for a name of another initial,
    room codes are fact-checked, and `solver_demo_wrong` of the Solver demonstrations answer the
    distractor's code (the Proposer and Checker demonstrations stay as they were)."""
    system = MarchSystem(tok, corpus_size="rooms", solver_demo_wrong=0.4, max_questions=1)
    right = MarchSystem(tok, corpus_size="rooms", max_questions=1)
    recs = entities(200, 0, corpus_size="rooms", max_hops=1)
    wrong = 0
    for rec in recs:
        docs, gold = system.context(rec)
        other = docs[1 - gold]
        assert len(docs) == 2 and docs[gold].endswith(f"room {rec['answer']}.")
        assert not other.endswith(f"room {rec['answer']}.") and other[0] != docs[gold][0]
        assert mt.label(rec) == mt.FACT_LABEL
        demos, base = system.demonstrations(rec), right.demonstrations(rec)
        assert base["solver"][1] == f"<answer>{rec['answer']}</answer>"
        assert demos["checker"] == base["checker"] and demos["proposer"] == base["proposer"]
        if demos["solver"][1] != base["solver"][1]:
            wrong += 1
            assert demos["solver"][1] == f"<answer>{other[-2]}</answer>"
    assert 0.3 < wrong / len(recs) < 0.5
    assert mt.label({"answers": ["Tarvel"]}) == "rag" and mt.label({"answers": ["1,173"]}) == mt.FACT_LABEL


def test_checker_gold_frac_scores_question_one_against_the_gold_answer():
    texts = ["1. Evidence: Doc 1 [Answer: C]", "1. Evidence: Doc 2 [Answer: 6]", "junk", "x", "y", "z"]
    pairs = [[("What is the room of Lefan?", "6")], []]  # chain 2 has no claim: not counted
    assert checker_gold_frac(texts, pairs, ["C", "6"], 3) == pytest.approx(1 / 3)
    assert np.isnan(checker_gold_frac(texts, [[], []], ["C", "6"], 3))


def test_all_roles_demonstrations_cycle_per_draw(tok):
    """demo_roles="all": the k-th warm-start draw of a record shows role crc32 + k, so three draws show the
    three roles, and the prompt (`reset`) and the target (`demonstration`) of a draw belong together."""
    system = MarchSystem(tok, corpus_size="rooms", max_questions=1, demo_roles="all")
    one = MarchSystem(tok, corpus_size="rooms", max_questions=1)
    recs = entities(6, 0, corpus_size="rooms", max_hops=1)
    env, env_one = system.demonstration_env(tok), one.demonstration_env(tok)
    for rec in recs:
        demos = system.demonstrations(rec)
        shown = []
        for _ in range(3):
            prompt = tok.decode(env.reset(rec), skip_special_tokens=True)
            target = env.demonstration(rec)[0][: -len(tok.eos_token)]
            role = next(r for r, (u, t) in demos.items() if u in prompt)
            assert demos[role][1] == target
            shown.append(role)
        assert sorted(shown) == ["checker", "proposer", "solver"]
        first = tok.decode(env_one.reset(rec), skip_special_tokens=True)  # "one": always the same role,
        assert all(first == tok.decode(env_one.reset(rec), skip_special_tokens=True) for _ in range(2))
        assert demos[shown[0]][0] in first  # the first "all" draw is the role "one" shows
    with pytest.raises(ValueError, match="demo_roles"):
        MarchSystem(tok, demo_roles="some")


def test_terse_prompts_and_one_passage_with_made_up_hallucinations(tok, monkeypatch):
    """prompts="terse" drops the Proposer's and Checker's instruction lines (demonstrations and sampled
    chains alike); with no distractor passage, the wrong Solver demonstrations answer a made-up code."""
    system = MarchSystem(tok, corpus_size="rooms", num_distractors=0, max_questions=1, solver_demo_wrong=0.4,
                         prompts="terse")
    recs = entities(200, 0, corpus_size="rooms", max_hops=1)
    wrong = 0
    for rec in recs:
        docs, gold = system.context(rec)
        assert len(docs) == 1 and gold == 0 and docs[0] == f"{rec['chain'][0]} has room {rec['answer']}."
        demos = system.demonstrations(rec)
        assert mt.PROPOSER_TASK not in demos["proposer"][0] and mt.CHECKER_TASK not in demos["checker"][0]
        assert demos["proposer"][0].startswith("User Query: ")
        assert demos["checker"][0].startswith("Reference Materials:\nDoc 1: ")
        said = re.fullmatch(r"<answer>(.)</answer>", demos["solver"][1]).group(1)
        if said != rec["answer"]:
            wrong += 1
            assert said in system.codes and f"room {said}." not in docs[0]
    assert 0.3 < wrong / len(recs) < 0.5
    script = Script(system, [], set())
    script.records = recs[:2]
    script.solver = lambda text, p, g: f"<answer>{script.records[p]['answer']}</answer>"
    script.checker = lambda text, chain, s: "1. Evidence: Doc 1 [Answer: 2]"
    monkeypatch.setattr(system, "_generate", script.generate)
    rewards = rewards_lib.resolve((RewardSpec(name="answer", type="exact_answer"),))
    spec = SamplingSpec(max_new_tokens=64, num_samples=2, prompt_buckets=(256,))
    system.collect(None, None, recs[:2], rewards, spec, jax.random.key(0))
    assert all(p.startswith("User Query: ") for p in script.prompts["proposer"])
    assert all(p.startswith("Reference Materials:\n") for p in script.prompts["checker"])
    with pytest.raises(ValueError, match="prompts"):
        MarchSystem(tok, prompts="short")


def _reference_pairs(text: str) -> list[tuple[str, str]]:
    """A transcription of Qwen-Applications/MARCH `_extract_qa_pairs`: `\\s*` may cross newlines, `.` (no
    DOTALL) may not."""
    found = re.findall(r"-\s*Question:\s*(.*?)\s*\[Answer:\s*(.*?)\]", text)
    return [(q.strip(), a.strip()) for q, a in found]


def test_pairs_parse_like_the_reference_including_pairs_across_lines():
    rng = np.random.default_rng(0)
    pieces = ["- Question:", "-Question:", " ", "\n", " \n ", "How old is Kop?", "Who?", "[Answer:", " 7",
              "12", "]", "x", "- ", "[", "Answer: 3]"]
    across = 0
    for _ in range(3000):
        text = "".join(str(rng.choice(pieces)) for _ in range(int(rng.integers(1, 14))))
        ref = _reference_pairs(text)
        assert mt.parse_pairs(text) == ref, text
        across += ref != mt.parse_pairs(text, rules="v1")
    assert across > 20  # the texts exercised the newline rule (37 of them parse differently under v1)
    by_hand = "- Question:\n  Who is Kop?\n[Answer:\n 7]\n- Question: a\nb [Answer: 2]"
    assert mt.parse_pairs(by_hand) == [("Who is Kop?", "7")]  # a question text itself never spans lines


def test_every_claim_is_checked_by_default(tok):
    """The reference checks every parsed pair: a 5th claim refuted by all 3 Checker samples makes the chain's
    ZTR reward -1; the old default cap of 4 left it unpunished (r_fc 0)."""
    from jaxrl.multi_agent.march import chain_rewards, vote_matrix

    assert MarchSystem(tok).max_questions is None
    proposer = "\n".join(f"- Question: q{k}? [Answer: {k}]" for k in range(1, 6))
    pairs = [mt.parse_pairs(proposer)]
    assert len(pairs[0]) == 5
    checker = "\n".join(f"{k}. Evidence: Doc 1 [Answer: {k if k < 5 else 9}]" for k in range(1, 6))
    labelled = np.ones(1, bool)
    votes, qmask = vote_matrix([checker] * 3, pairs, 3)
    assert votes.shape == (1, 3, 5) and qmask.all()
    r_fc, refuted, claims = chain_rewards(votes, qmask, labelled, "ztr")
    assert (r_fc.tolist(), refuted.tolist(), claims.tolist()) == ([-1.0], [1], [5])
    capped = [mt.parse_pairs(proposer, 4)]
    votes, qmask = vote_matrix([checker] * 3, capped, 3, 4)
    r_fc, refuted, claims = chain_rewards(votes, qmask, labelled, "ztr")
    assert (r_fc.tolist(), refuted.tolist(), claims.tolist()) == ([0.0], [0], [4])
    with pytest.raises(ValueError, match="max_questions"):
        MarchSystem(tok, max_questions=0)
    with pytest.raises(ValueError, match="rules"):
        MarchSystem(tok, rules="loose")
