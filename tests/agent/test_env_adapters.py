"""Environments written for gymnasium, skyrl-gym and TRL run under `env:` unchanged (jaxrl.envs.adapters*).

One run (tiny model, 1 layer) trains one step on each adapter in turn, with the adapters' episodes laid out
in the same row shapes so that the three steps share their compiled programs; every row is replayed through
a fresh env: prompt, actions (the loss-masked tokens) and observations (never trained on) must be exactly the
row's tokens. One `jaxrl train` subprocess runs skyrl-gym's gsm8k env from a config, one shows a wrong API
exiting 2 in one line; the other bad inputs are checked in-process (the same EnvError / ConfigError lines).
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from tests._xla import xla_flags

from jaxrl.config import load_config
from jaxrl.data.tasks import arithmetic
from jaxrl.envs import Action, EpisodeBudget, make_env, scripted_episodes
from jaxrl.envs.adapters import messages_ids
from jaxrl.errors import ConfigError, EnvError
from jaxrl.io.tokenizer import builtin_tokenizer
from adapter_envs import INVALID

TOK = builtin_tokenizer()
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HELPERS = f"{HERE}/adapter_envs.py"  # by path, as a config names a user's file
SYSTEM = "Answer as '#### n'."
ADAPTERS = {  # env.name -> env.params: one real environment per API
    "gym": {"env": f"{HELPERS}:FrozenLakeText", "instructions": "Reach G; write left, down, right or up.\n"},
    "skyrl": {"env": "gsm8k_multi_turn", "extras": {"max_turns": 2}, "system": SYSTEM},
    "trl": {"env": f"{HELPERS}:AddEnv", "tool_role": "user"},
}
CONFIG = f"""
model: {{preset: tiny, overrides: {{num_layers: 1, max_position_embeddings: 1024}}}}
tokenizer: {{kind: builtin}}
data: {{source: arithmetic, prompts_per_step: 2, train_size: 8, eval_size: 2, seed: 0}}
env: {{name: skyrl, params: {{env: gsm8k_multi_turn, extras: {{max_turns: 2}}, system: "{SYSTEM}"}},
      max_turns: 3, max_total_tokens: 512}}
rollout: {{group_size: 4, max_new_tokens: 16, prompt_buckets: [512], gen_buckets: [16],
          logprobs_from_sampler: true}}
algorithm: {{name: grpo}}
rewards: [{{name: correct, type: exact_answer}},
          {{name: digits, type: function, function: '{HELPERS}:digit_frac', weight: 0.5}}]
optimizer: {{lr: 1.0e-2, warmup_steps: 0}}
checkpoint: {{every: 1, keep: 1, async_save: false}}
logging: {{tensorboard: false, progress_bar: false, sample_every: 1, num_samples: 1}}
sft_warmup: {{steps: 0}}
train: {{steps: 1, seed: 0, eval_every: 0}}
"""
MESH = "mesh: {data: 8, fsdp: 1, tensor: 1}\n"  # in-process, on the 8 test devices: rows split, no FSDP (cheaper)


def _action(text: str) -> Action:
    ids = tuple(TOK.encode(text, add_special_tokens=False))
    return Action(ids, text, False)


def _replay(factory, ro, row: int) -> tuple[float, int]:
    """Plays row `row` of a rollout again through a fresh env: its prompt must be reset's ids, each run of
    loss-masked tokens is an action and the unmasked run after it must be exactly that step's observation.
    Returns (the replayed return, turns)."""
    w, env = ro.prompt_width, factory(TOK)
    tokens, real, train = ro.tokens_BL[row], ro.mask_BL[row], ro.completion_mask_BT[row]
    prompt = env.reset(ro.records[row])
    assert tokens[w - len(prompt):w].tolist() == prompt and real[w - len(prompt):w].all()
    assert not real[:w - len(prompt)].any()
    n = int(real[w:].sum())
    assert real[w:w + n].all() and not train[n:].any()  # the completion is contiguous, then padding
    comp, sampled = tokens[w:w + n].tolist(), train[:n]
    i, total, turns = 0, 0.0, 0
    while i < n:
        j = i + int(np.argmin(np.append(sampled[i:], False)))  # end of the action run
        assert j > i, "each turn starts with sampled tokens"
        ids = comp[i:j]
        res = env.step(Action(tuple(ids), TOK.decode(ids, skip_special_tokens=True), ids[-1] == TOK.eos_token_id))
        k = j + int(np.argmax(np.append(sampled[j:], True)))  # end of the observation run
        if k > j:
            assert comp[j:k] == list(res.observation)  # the env's tokens, fed once, not trained on
        total, turns, i = total + res.reward, turns + 1, k
    return total, turns


@pytest.fixture(scope="module")
def run_state(tmp_path_factory):
    from jaxrl.rl import setup as rl_setup

    path = tmp_path_factory.mktemp("adapters") / "config.yaml"
    path.write_text(CONFIG + MESH)
    run, state, _ = rl_setup.setup(load_config(str(path)), path.parent / "run")
    # one row shape for all three (the TRL prompt, with its tool schemas, is the longest): shared programs
    run.collector.budget = dataclasses.replace(run.collector.budget, row_buckets=(512,))
    return {"run": run, "state": state}  # the state goes on from step to step (the update donates it)


def _flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(params)])


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_adapter_trains_one_step_token_exactly(run_state, name):
    from jaxrl.rl.step import rl_step

    run = run_state["run"]
    factory = make_env(name, ADAPTERS[name], tokenizer=TOK)
    run.collector.env_factory = factory
    before = _flat(run_state["state"].params)
    run_state["state"], metrics, ro = rl_step(run, run_state["state"], arithmetic(2, seed=3), step=0)
    assert np.isfinite(metrics["loss"]) and metrics["env/errors"] == 0
    assert ro.tokens_BL.shape == (8, 1024)  # the shared shape
    assert not np.array_equal(before, _flat(run_state["state"].params))  # the step updated the model
    for row in range(8):
        total, turns = _replay(factory, ro, row)
        assert total == pytest.approx(float(ro.rewards_BR[row, 0]), abs=1e-6)
        assert 1 <= turns <= 3
    assert (ro.old_logp_BT[~ro.completion_mask_BT] == 0).all()  # log-probs only on sampled tokens
    if name == "gym":  # FrozenLake's map every turn (invalid moves keep the episode going)
        assert metrics["episode/obs_tokens"] > 0
    if name == "skyrl":  # the multi-turn gsm8k env asks once more before its 2 turns end (or EOS ends it)
        assert metrics["episode/turns"] > 1 and metrics["episode/finished_frac"] == 1.0


def test_trl_tool_calls_are_tool_messages_never_trained_on():
    factory = make_env("trl", ADAPTERS["trl"], tokenizer=TOK)
    records = [{"prompt": "What is 3 + 4?", "answer": "7"}]
    call = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    plays = [call, '<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "<answer>7</answer>"]
    eps = scripted_episodes(records, TOK, factory, lambda r: plays, EpisodeBudget(max_turns=4, row_buckets=(512,)))
    w = eps.prompt_width
    prompt = TOK.decode(eps.tokens_BL[0, :w], skip_special_tokens=False)
    assert '"name":"add"' in prompt and "What is 3 + 4? Use add." in prompt  # schemas; reset's string appended
    obs1 = messages_ids(TOK, [{"role": "user", "content": "7"}])
    obs2 = messages_ids(TOK, [{"role": "user", "content": "{'error': 'Tool mul not found.'}"}])
    actions = [TOK.encode(p, add_special_tokens=False) for p in plays]
    row = [*actions[0], *obs1, *actions[1], *obs2, *actions[2]]
    n = len(row)
    assert eps.tokens_BL[0, w:w + n].tolist() == row
    assert eps.loss_mask_BL[0, w:w + n].tolist() == [True] * len(actions[0]) + [False] * len(obs1) + \
        [True] * len(actions[1]) + [False] * len(obs2) + [True] * len(actions[2])
    assert eps.rewards_B[0] == 1.0  # get_reward: the last sum is the answer
    assert (eps.tool_calls_B[0], eps.tool_errors_B[0], eps.turns_B[0]) == (2, 1, 3)


def test_records_reach_the_wrapped_envs():
    gym = make_env("gym", ADAPTERS["gym"], tokenizer=TOK)(TOK)
    record = {"prompt": "What is 1 + 1?", "answer": "2", "prompt_ids": [1, 2]}
    gym.reset(record)
    assert gym.env.options == {"prompt": "What is 1 + 1?", "answer": "2"}  # reset(options=row)
    res = gym.step(_action("nothing"))
    assert TOK.decode(res.observation).count(INVALID) == 1 and not res.done
    skyrl = make_env("skyrl", {"env": "gsm8k"}, tokenizer=TOK)(TOK)
    skyrl.reset(record)
    assert skyrl.env.ground_truth == "2"  # extras.reward_spec from the record's answer
    res = skyrl.step(_action("so #### 2"))
    assert (res.reward, res.done) == (1.0, True)


def test_wrong_api_names_the_missing_methods():
    with pytest.raises(ConfigError, match=r"GSM8kEnv lacks reset; a gymnasium text env needs"):
        make_env("gym", {"env": "skyrl_gym.envs.gsm8k.env:GSM8kEnv"}, tokenizer=TOK)
    with pytest.raises(ConfigError, match=r"FrozenLakeEnv lacks init; a skyrl-gym text env"):
        make_env("skyrl", {"env": "gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv"}, tokenizer=TOK)
    with pytest.raises(ConfigError, match=r"trl env .*: NoReset lacks reset; TRL's environment_factory"):
        make_env("trl", {"env": "adapter_envs:NoReset"}, tokenizer=TOK)
    with pytest.raises(ConfigError, match=r"tool 'step' cannot be described .* no docstring"):
        make_env("trl", {"env": "adapter_envs:Endless"}, tokenizer=TOK)
    with pytest.raises(ConfigError, match=r"'gsm9k': not a registered skyrl-gym env \(registered: aime"):
        make_env("skyrl", {"env": "gsm9k"}, tokenizer=TOK)
    with pytest.raises(ConfigError, match=r"env 'gym' needs env.params.env"):
        make_env("gym", {}, tokenizer=TOK)


def test_non_text_raising_and_endless_envs():
    spec = EpisodeBudget(max_turns=3, row_buckets=(128,))
    records = [{"prompt": "p", "answer": "1"}]
    lake = make_env("gym", {"env": "adapter_envs:IntLake"}, tokenizer=TOK)
    with pytest.raises(EnvError, match=r"^gym env 'adapter_envs:IntLake': step \(turn 2\) returned an observation "
                                       r"that is a int \(4\); expected a str \(wrap a non-text env in a gymnasium"):
        scripted_episodes(records, TOK, lake, lambda r: ["a", "b", "c"], spec)
    raw = make_env("gym", {"env": "gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv"}, tokenizer=TOK)
    with pytest.raises(EnvError, match=r"FrozenLakeEnv': reset returned an observation that is a int \(0\)"):
        scripted_episodes(records, TOK, raw, lambda r: ["a"], spec)
    raising = make_env("gym", {"env": "adapter_envs:Raising"}, tokenizer=TOK)
    line = (r"^gym env 'adapter_envs:Raising': step \(turn 2\) raised RuntimeError: the game server is down "
            r"at .*adapter_envs.py:\d+$")
    with pytest.raises(EnvError, match=line):
        scripted_episodes(records, TOK, raising, lambda r: ["a", "b", "c"], spec)
    ended = scripted_episodes(records, TOK, raising, lambda r: ["a", "b", "c"],
                              dataclasses.replace(spec, on_error="end_episode"))
    assert ended.errors_B.tolist() == [True] and ended.rewards_B[0] == 0.0 and ended.turns_B[0] == 2
    assert "the game server is down" in ended.first_error
    endless = make_env("gym", {"env": "adapter_envs:Endless"}, tokenizer=TOK)
    eps = scripted_episodes(records, TOK, endless, lambda r: ["a"] * 10, spec)
    assert eps.turns_B[0] == 3 and not eps.finished_B[0] and eps.rewards_B[0] == 1.5  # max_turns ended it


def test_skyrl_gsm8k_trains_from_a_config(tmp_path, train_cli):
    config = tmp_path / "skyrl.yaml"
    config.write_text(CONFIG.replace("prompt_buckets: [512]", "prompt_buckets: [256]"))
    rows = train_cli(str(config), tmp_path / "run", {}, timeout=300)
    assert len(rows) == 1 and rows[0]["episode/turns"] > 1 and rows[0]["env/errors"] == 0
    assert rows[0]["episode/obs_tokens"] > 0  # the env's second question, fed as a user message


def test_cli_wrong_api_exits_2_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_CACHE")} | {"XLA_FLAGS": xla_flags()}
    env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    config = tmp_path / "bad.yaml"
    config.write_text(CONFIG)
    argv = [sys.executable, "-m", "jaxrl.cli", "train", str(config), "--run-dir", str(tmp_path / "run"),
            "--set", "env={name: gym, params: {env: 'skyrl_gym.envs.gsm8k.env:GSM8kEnv'}}"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["jaxrl train: error: gym env 'skyrl_gym.envs.gsm8k.env:GSM8kEnv': GSM8kEnv lacks reset; a "
                      "gymnasium text env needs reset(seed=, options=) -> (str, info) and step(str) -> 5-tuple"]
    assert "Traceback" not in proc.stderr
