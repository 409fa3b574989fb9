"""The `pairwise` reward with a judge model: rubric replies parsed and scored as OpenRS, grouped into rewards;
a tiny local judge model gives finite, deterministic rewards from one compiled sampler program."""

import json

import numpy as np
import pytest
from flax import nnx

from jaxrl import sampling
from jaxrl.io import model_io
from jaxrl.config import RewardSpec
from jaxrl.errors import ConfigError
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.rewards import resolve, score
from jaxrl.rewards.judges.local_judge import generate_texts
from jaxrl.rewards.judges.openrs_judge import fill, judgement_score, parse_judgement
from jaxrl.io.tokenizer import builtin_tokenizer

TEMPLATE = "Q:{query}\nA:{response_a}\nB:{response_b}\nJSON:"


def _fenced(*criteria):
    items = [{"type": t, "chosen": c, "score": s} for t, c, s in criteria]
    return "Criteria first.\n```json\n" + json.dumps({"rubric_compares": items}) + "\n```"


# The judge's replies, keyed by (response A, response B) of completions "x", "yy", "zzz".
REPLIES = {
    ("x", "yy"): _fenced(("core", "B", 2), ("important", "A", 1)),       # (5·−2 + 2·1) / 7 = −8/7
    ("yy", "x"): _fenced(("core", "A", 2), ("highlight", "tie", 3)),     # (5·2 + 1·0) / 6 = 5/3
    ("x", "zzz"): "no JSON here",                                        # unparsable → 0
    ("zzz", "x"): _fenced(("fatal", "B", 3), ("core", "A", 3)),          # veto: −3
    ("yy", "zzz"): 'Verdict: {"rubric_compares": [{"type": "highlight", "chosen": "A", "score": 1}]} ok',
    ("zzz", "yy"): None,                                                 # no reply: pair (yy, zzz) left out
}
CALLS = []


def stub_generate(requests):
    CALLS.append(list(requests))
    out = []
    for r in requests:
        a = r.split("\nA:")[1].split("\nB:")[0]
        b = r.split("\nB:")[1].split("\nJSON:")[0]
        out.append(REPLIES[(a, b)])
    return out


def test_fill_is_one_pass():
    filled = fill(TEMPLATE, query="{response_b}", response_a="{x}", response_b="b")
    assert filled == "Q:{response_b}\nA:{x}\nB:b\nJSON:"


def test_parse_and_score_replies():
    assert parse_judgement("no JSON here") is None and judgement_score("no JSON here") == 0.0
    assert judgement_score('```json\n{"rubric_compares": [{"chosen": "A", "score": "x"}]}\n```') == 0.0
    assert judgement_score('```json\n{"verdict": "A"}\n```') == 0.0
    assert judgement_score(REPLIES[("x", "yy")]) == pytest.approx(-8 / 7, abs=1e-5)
    assert judgement_score(REPLIES[("yy", "zzz")]) == pytest.approx(1.0, abs=1e-5)
    # the last fenced block wins over an earlier one
    assert judgement_score(_fenced(("core", "B", 1)) + "\n" + _fenced(("core", "A", 2))) == pytest.approx(2.0)


@pytest.mark.parametrize("mode,expected", [
    # d_ij = ½(S_ij − S_ji): d01 = ½(−8/7 − 5/3), d02 = ½(0 + 3); pair (1, 2) has no valid reverse.
    ("score", [(0.5 * (-8 / 7 - 5 / 3) + 1.5) / 2, 0.5 * (5 / 3 + 8 / 7), -1.5]),
    # verdicts: (0, 1) → B better: −1 / +1; (0, 2): S_f = 0, S_b = −3 → tie.
    ("verdict", [-0.5, 1.0, 0.0]),
])
def test_stub_judge_through_resolve_equals_hand_computed(mode, expected):
    spec = RewardSpec(name="judge", type="pairwise", params={
        "judge": {"generate": f"{__name__}:stub_generate"}, "group_size": 3, "mode": mode,
        "prompt_template": TEMPLATE})
    CALLS.clear()
    comps = ["x", "yy", "zzz"] * 2
    rewards, info = score(resolve([spec]), ["p1"] * 3 + ["p2"] * 3, comps)
    assert len(CALLS) == 1 and len(CALLS[0]) == 2 * 3 * 2       # every ordered pair of the step, one call
    assert CALLS[0][0].startswith("Q:p1\nA:x\nB:yy") and CALLS[0][-1].startswith("Q:p2\nA:zzz\nB:yy")
    np.testing.assert_allclose(rewards[:, 0], expected * 2, atol=1e-5)
    assert info.errors == {"judge": 0}


def test_rows_of_a_group_must_share_their_prompt():
    # e.g. an evaluation batch of one greedy sample per prompt: no pairs, so every sample fails (not judged)
    spec = RewardSpec(name="judge", type="pairwise", params={
        "judge": {"generate": f"{__name__}:stub_generate"}, "group_size": 2, "prompt_template": TEMPLATE})
    CALLS.clear()
    rewards, info = score(resolve([spec]), ["p1", "p2", "p3", "p4"], ["x", "yy", "x", "yy"])
    assert info.errors == {"judge": 4} and CALLS == [] and (rewards == 0).all()
    assert "do not share one prompt" in info.first_failure["judge"]


@pytest.mark.parametrize("params,message", [
    ({"judge": {"model": "/no/such/dir"}}, "rewards[j].params.judge.model='/no/such/dir': does not exist"),
    ({"judge": {"generate": f"{__name__}:stub_generate", "model": "x"}}, "give exactly one of model"),
    ({"judge": {"generate": f"{__name__}:stub_generate", "max_new_tokens": 4}},
     "rewards[j].params.judge.max_new_tokens: not used with generate"),
    ({"judge": {"generate": f"{__name__}:stub_generate"}, "prompt_template": "{query} {response_a}"},
     "rewards[j].params.prompt_template: must contain {response_b}"),
    ({"judge": f"{__name__}:stub_generate", "prompt_template": TEMPLATE},
     "rewards[j].params.prompt_template: only used with a judge model"),
])
def test_bad_judge_specs_are_config_errors(params, message):
    with pytest.raises(ConfigError) as e:
        resolve([RewardSpec(name="j", type="pairwise", params={"group_size": 2, **params})])
    assert message in str(e.value)


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory):
    tok = builtin_tokenizer()
    cfg = TransformerConfig.tiny(vocab_size=len(tok), num_layers=1, max_position_embeddings=96,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    path = tmp_path_factory.mktemp("judge") / "ckpt"
    return str(model_io.save_model_checkpoint(model, path, tokenizer=tok))


def test_tiny_local_judge_is_finite_deterministic_and_compiles_once(tiny_judge):
    spec = RewardSpec(name="judge", type="pairwise", params={
        "judge": {"model": tiny_judge, "max_new_tokens": 12, "batch_size": 4}, "group_size": 2,
        "mode": "score", "prompt_template": TEMPLATE})
    resolved = resolve([spec])
    prompts, comps = ["What is 1 + 2?"] * 2 + ["What is 4 + 0?"] * 2, ["3", "4", "<answer>4</answer>", "5"]
    first, _ = score(resolved, prompts, comps)
    compiled = sampling.compile_count()
    second, _ = score(resolved, prompts, comps)
    assert first.shape == (4, 1) and np.isfinite(first).all()
    np.testing.assert_array_equal(first, second)
    assert sampling.compile_count() == compiled                   # same shapes: no new sampler program
    # a request too long for the judge's context gets no reply; the others one each
    replies = generate_texts(["x" * 200, "Q:1\nA:2\nB:3\nJSON:"], model=tiny_judge, max_new_tokens=12,
                             batch_size=4)
    assert replies[0] is None and isinstance(replies[1], str)
    assert replies[1] == generate_texts(["Q:1\nA:2\nB:3\nJSON:"], model=tiny_judge, max_new_tokens=12,
                                        batch_size=4)[0]
