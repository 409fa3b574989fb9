"""The `evpv` reward: PRM step rewards gated by premise reliability (losses.research.evpv) and aggregated;
checked against hand-computed values, for a PRM function, a reward model per step prefix (stubbed, and a tiny
real one), and the arithmetic example functions of configs/evpv_tiny.yaml."""

import numpy as np
import pytest
from flax import nnx

import jaxrl.rewards.judges.model_reward
from jaxrl.config import RewardSpec
from jaxrl.errors import ConfigError
from jaxrl.models import TransformerConfig
from jaxrl.reward_model.model import RewardModel, save_reward_model
from jaxrl.rewards import resolve, score
from jaxrl.io.tokenizer import builtin_tokenizer

STEPS = {("a", "b", "c", "d"): ([1, 1, -1, 1], ([True, False, False, True], 0, 2)),   # p = 0.6
         ("e", "f"): ([1, -1], ([True, True], 1, 0))}                                # p = 0.5
COMPLETIONS = ["a\nb\nc\nd", "e\n\nf", ""]


def prm(prompt, steps):
    return STEPS[tuple(steps)][0]


def premise(prompt, steps):
    return STEPS[tuple(steps)][1]


def _evpv(completions, prompts=None, **params):
    spec = RewardSpec(name="evpv", type="evpv", params=params)
    rewards, info = score(resolve([spec]), prompts or ["p"] * len(completions), completions)
    return rewards[:, 0], info


@pytest.mark.parametrize("aggregator,expected", [
    # gated: [0.6, 1, −1, 0.6] and [0.5, −1]; no step → 0
    ("mean", [1.2 / 4, -0.25, 0.0]),
    ("correctness_rate", [0.25, 0.0, 0.0]),           # exact s_t = 1 test: gated steps do not count
    ("position_weighted", [(0.6 + 2 - 3 + 2.4 + 10) / 20, (0.5 - 2 + 3) / 6, 0.0]),
    ("first_error", [2 / 4, 1 / 2, 0.0]),
])
def test_prm_function_gated_and_aggregated(aggregator, expected):
    got, _ = _evpv(COMPLETIONS, prm=f"{__name__}:prm", premise=f"{__name__}:premise", aggregator=aggregator)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_without_premise_nothing_is_gated():
    got, _ = _evpv(COMPLETIONS, prm=f"{__name__}:prm")
    np.testing.assert_allclose(got, [0.5, 0.0, 0.0], atol=1e-6)


def test_reward_model_scores_every_step_prefix_in_one_call(monkeypatch, tmp_path):
    calls = []

    def fake_model_reward(prompts, completions, *, checkpoint, batch_size, max_len):
        calls.append((list(prompts), list(completions), max_len))
        return [None if "bad" in c else (1.0 if c.endswith("ok") else -1.0) for c in completions]

    monkeypatch.setattr(jaxrl.rewards.judges.model_reward, "model_reward", fake_model_reward)
    got, info = _evpv(["1 ok\n2 no\n3 ok", "bad", "x ok"], ["p0", "p1", "p2"],
                      prm={"checkpoint": str(tmp_path), "threshold": 0.5, "max_len": 7})
    prefixes = ["1 ok", "1 ok\n2 no", "1 ok\n2 no\n3 ok", "bad", "x ok"]
    assert calls == [(["p0", "p0", "p0", "p1", "p2"], prefixes, 7)]
    np.testing.assert_allclose(got, [1 / 3, 0.0, 1.0], atol=1e-6)   # r = [1, −1, 1]; "bad" fails → 0
    assert info.errors == {"evpv": 1}


@pytest.mark.parametrize("completion,expected", [
    ("47 + 3 = 50\n<answer>50</answer>", 1.0),        # right, premise quoted correctly
    ("46 + 3 = 49\nso 49", (0.5 - 1) / 2),            # misread premise (n_high = 1): p = 0.5; wrong answer
    ("47 - 3 = 44\n50", (0.8 + 1) / 2),               # other operator (n_low = 1): p = 0.8
    ("47 + 3 = 51\n51", -1.0),
])
def test_arithmetic_example_functions(completion, expected):
    got, _ = _evpv([completion], ["What is 47 + 3?"], prm="jaxrl.rewards.arithmetic_steps:step_rewards",
                   premise="jaxrl.rewards.arithmetic_steps:premise_audit")
    np.testing.assert_allclose(got, [expected], atol=1e-6)


@pytest.mark.parametrize("params,message", [
    ({"prm": f"{__name__}:prm", "aggregator": "max"}, "rewards[e].params.aggregator='max': allowed values"),
    ({"prm": {"checkpoint": "/no/such"}}, "rewards[e].params.prm.checkpoint='/no/such': does not exist"),
    ({"prm": {"path": "x"}}, "rewards[e].params.prm: a reward model is {checkpoint: PATH"),
    ({"prm": {"checkpoint": ".", "threshold": "high"}}, "rewards[e].params.prm.threshold='high': must be a"),
    ({"prm": f"{__name__}:prm", "premise": "no_such_mod:f"}, "rewards[e].params.premise='no_such_mod:f'"),
])
def test_config_errors(params, message):
    with pytest.raises(ConfigError) as e:
        resolve([RewardSpec(name="e", type="evpv", params=params)])
    assert message in str(e.value)


def test_a_real_reward_model_as_prm(tmp_path):
    tok = builtin_tokenizer()
    cfg = TransformerConfig.tiny(vocab_size=len(tok), num_layers=1, pad_token_id=tok.pad_token_id)
    rm = str(save_reward_model(RewardModel(cfg, rngs=nnx.Rngs(0)), tmp_path / "rm", tokenizer=tok))
    prefixes = ["1 + 1 = 2", "1 + 1 = 2\nso 2", "1 + 1 = 2\nso 2\n<answer>2</answer>", "7"]
    scores = jaxrl.rewards.judges.model_reward.model_reward(["What is 1 + 1?"] * 4, prefixes, checkpoint=rm)
    threshold = float(sorted(scores)[1])          # two prefixes above it, two at or below
    r = [1.0 if s > threshold else -1.0 for s in scores]
    got, info = _evpv([prefixes[2], prefixes[3]], ["What is 1 + 1?"] * 2,
                      prm={"checkpoint": rm, "threshold": threshold})
    np.testing.assert_allclose(got, [sum(r[:3]) / 3, r[3]], atol=1e-6)
    assert info.errors == {"evpv": 0} and sorted(r) == [-1.0, -1.0, 1.0, 1.0]
