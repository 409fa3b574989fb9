"""The env API: registry validation (did-you-mean, user classes from a module or a file), tool calls and
errors as observations, exact-match rewards, chat-message observations, and the masks of episode rows."""

import numpy as np
import pytest

from jaxrl.envs import (Action, EpisodeBudget, SearchEnv, ToolEnv, make_env, message_ids, normalize_answer,
                        scripted_episodes)
from jaxrl.errors import ConfigError, UserError
from jaxrl.io.tokenizer import builtin_tokenizer

TOK = builtin_tokenizer()


def _act(text):
    return Action(tuple(TOK.encode(text, add_special_tokens=False)), text)


def test_make_env_validates_up_front(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'search'"):
        make_env("serch")
    hint = r"unknown key 'env.params.top_kk'; did you mean 'env.params.top_k'"
    with pytest.raises(ConfigError, match=hint):
        make_env("search", {"top_kk": 2})
    with pytest.raises(ConfigError, match="obs_format='xml'"):
        make_env("search", {"obs_format": "xml"}, tokenizer=TOK)
    with pytest.raises(ConfigError, match="tools=\\['calc'\\]"):
        make_env("tools", {"tools": ["calc"]}, tokenizer=TOK)
    assert isinstance(make_env("search", {"top_k": 2})(TOK), SearchEnv)
    assert make_env("jaxrl.envs.search:ToolEnv").cls is ToolEnv
    with pytest.raises(ConfigError, match="has no class 'Nope'"):
        make_env("jaxrl.envs.search:Nope")
    with pytest.raises(ConfigError, match="cannot import"):
        make_env("no_such_module_xyz:Env")
    user = tmp_path / "my_env.py"
    user.write_text(
        "class CountEnv:\n"
        "    stop_strings = ('!',)\n"
        "    def __init__(self, tokenizer, *, target: int):\n"
        "        self.tok, self.target = tokenizer, target\n"
        "    def reset(self, record):\n"
        "        return self.tok.encode('count', add_special_tokens=False)\n"
        "    def step(self, action):\n"
        "        from jaxrl.envs import StepResult\n"
        "        return StepResult([], float(action.text.count('a') == self.target), True)\n"
    )
    factory = make_env(f"{user}:CountEnv", {"target": 2}, tokenizer=TOK)
    assert factory(TOK).step(_act("aab!")).reward == 1.0
    with pytest.raises(ConfigError, match="needs env.params.target"):
        make_env(f"{user}:CountEnv", {})
    with pytest.raises(ConfigError, match="no file"):
        make_env(f"{tmp_path}/missing.py:CountEnv")


def test_tool_env_calls_errors_and_answers():
    env = ToolEnv(TOK, tools=("calculator",))
    prompt = TOK.decode(env.reset({"question": "6*7?", "answers": ["42"]}))
    assert prompt.startswith("<|user|>Use <calculator>...</calculator> when needed") and prompt.endswith(
        "Question: 6*7?<|assistant|>")
    assert env.stop_strings == ("</calculator>", "</answer>")
    res = env.step(_act("<calculator>6*7</calculator>"))
    assert TOK.decode(res.observation) == "\n<result>\n42\n</result>\n" and not res.done
    assert res.info == {"tool_calls": 1, "tool_errors": 0}
    res = env.step(_act("<calculator>__import__('os')</calculator>"))
    assert TOK.decode(res.observation).startswith("\n<result>\nerror: ") and res.info["tool_errors"] == 1
    assert not res.done and res.reward == 0.0
    res = env.step(_act("so <answer> The 42. </answer>"))
    assert res.done and res.reward == 1.0 and res.observation == []
    assert env.step(_act("<answer>41</answer>")).reward == 0.0
    assert env.step(_act("no call, no answer")).done
    assert env.step(Action((1,), "<calculator>1+1</calculator>", eos=True)).done  # EOS ends the episode


def test_normalize_answer():
    assert normalize_answer("  The  Velmora, Lighthouse! ") == "velmora lighthouse"
    assert normalize_answer("1,761,000") == "1761000" and normalize_answer("An Apple a day") == "apple day"


def test_message_observation_rendered_once_with_the_template():
    ids = message_ids(TOK, "user", "hi")
    assert TOK.decode(ids) == "<|eos|><|user|>hi<|assistant|>"
    env = ToolEnv(TOK, tools=("calculator",), obs_format="message")
    env.reset({"question": "q", "answers": ["2"]})
    obs = env.step(_act("<calculator>1+1</calculator>")).observation
    assert TOK.decode(obs) == "<|eos|><|user|><result>\n2\n</result><|assistant|>"


def test_episode_rows_masks_and_budgets():
    records = [{"question": "2+3?", "answers": ["5"]}, {"question": "2*3?", "answers": ["6"]}]

    def policy(r):
        return [f"<calculator>{r['question'][:-1]}</calculator>", "<calculator>1/0</calculator>",
                f"<answer>{r['answers'][0]}</answer>"]

    factory = make_env("tools", {"tools": ["calculator"]}, tokenizer=TOK)
    spec = EpisodeBudget(max_turns=4, max_total_tokens=512, row_buckets=(128, 256))
    ep = scripted_episodes(records, TOK, factory, policy, spec, group_size=2)
    assert ep.tokens_BL.shape == (4, 128 + 256) and ep.prompt_width == 128
    np.testing.assert_array_equal(ep.rewards_B, 1.0)
    np.testing.assert_array_equal(ep.turns_B, 3)
    np.testing.assert_array_equal(ep.tool_calls_B, 2)
    np.testing.assert_array_equal(ep.tool_errors_B, 1)
    for n in range(4):
        acts = "".join(TOK.decode(ep.tokens_BL[n][ep.loss_mask_BL[n]]))
        assert acts == "".join(policy(records[n // 2]))
        obs = ep.mask_BL[n] & ~ep.loss_mask_BL[n]
        obs[: ep.prompt_width] = False
        assert TOK.decode(ep.tokens_BL[n][obs]).startswith("\n<result>\n" + records[n // 2]["answers"][0])
        assert int(obs.sum()) == ep.obs_tokens_B[n]
        comp = ep.tokens_BL[n, ep.prompt_width:][ep.mask_BL[n, ep.prompt_width:]]
        assert ep.completions[n] == TOK.decode(comp)
    np.testing.assert_array_equal(ep.turn_rewards_BU[:, :3], [[0, 0, 1]] * 4)
    # the turn budget cuts the episode before the answer: not finished, reward 0, last observation dropped
    short = scripted_episodes(records, TOK, factory, policy, EpisodeBudget(max_turns=2, max_total_tokens=512))
    assert not short.finished_B.any() and short.rewards_B.sum() == 0 and (short.turns_B == 2).all()
    assert TOK.decode(short.tokens_BL[0][short.mask_BL[0]]).endswith("<calculator>1/0</calculator>")
    # the token budget: the context never exceeds max_total_tokens
    tight = scripted_episodes(records, TOK, factory, policy, EpisodeBudget(max_turns=4, max_total_tokens=130))
    assert tight.mask_BL.sum(1).max() <= 130 and not tight.finished_B.any() and (tight.turns_B == 1).all()
    with pytest.raises(UserError, match="record 0 has 95 tokens; max_total_tokens=60"):
        scripted_episodes(records, TOK, factory, policy, EpisodeBudget(max_total_tokens=60))
