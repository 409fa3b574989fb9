"""The README's one-file user environment (docs/agentic_guess_env.py) named by path, as a config does:
validated by the registry, played by its bisection demonstration, with observations masked out."""

from pathlib import Path

import numpy as np
import pytest

from jaxrl.config import load_config
from jaxrl.envs import EpisodeBudget, make_env, scripted_episodes
from jaxrl.errors import ConfigError
from jaxrl.io.tokenizer import builtin_tokenizer

TOK = builtin_tokenizer()
REPO = Path(__file__).resolve().parents[2]
NAME = f"{REPO}/docs/agentic_guess_env.py:GuessEnv"


def test_guess_env_by_path_plays_its_demonstration():
    factory = make_env(NAME, {"low": 0, "high": 100}, tokenizer=TOK)
    with pytest.raises(ConfigError, match="unknown key 'env.params.hgh'"):
        make_env(NAME, {"hgh": 3})
    records = [{"prompt": "What is 47 + 3?", "answer": "50"}, {"prompt": "What is 9 - 9?", "answer": "0"}]
    env = factory(TOK)
    plays = [env.demonstration(r) for r in records]
    assert plays[0] == ["<guess>50</guess>"]  # the first bisection step hits 50
    assert plays[1][-1] == "<guess>0</guess>" and len(plays[1]) == 6  # 50, 24, 11, 5, 2, 0
    spec = EpisodeBudget(max_turns=8, max_total_tokens=512, row_buckets=(512,))
    eps = scripted_episodes(records, TOK, factory, env.demonstration, spec)
    np.testing.assert_array_equal(eps.rewards_B, [1.0, 1.0])
    np.testing.assert_array_equal(eps.turns_B, [1, 6])
    assert eps.completions[1].count(" higher\n") == 0 and eps.completions[1].count(" lower\n") == 5
    w = eps.prompt_width
    lower = TOK.encode(" lower\n", add_special_tokens=False)
    assert eps.obs_tokens_B[1] == 5 * len(lower)
    # the loss mask covers the guesses and never the observation tokens
    row, mask = eps.tokens_BL[1, w:], eps.loss_mask_BL[1, w:]
    assert int(mask.sum()) == eps.action_tokens_B[1] == sum(len(TOK.encode(a)) for a in plays[1])
    assert TOK.decode(row[mask].tolist()) == "".join(plays[1])
    # a wrong guess budget ends with reward 0
    short = scripted_episodes(records[1:], TOK, factory, env.demonstration, EpisodeBudget(max_turns=3))
    assert short.rewards_B[0] == 0.0 and not short.finished_B[0]


def test_config_names_the_user_env():
    cfg = load_config(REPO / "configs/quickstart.yaml",
                      [f"env={{name: '{NAME}', params: {{low: 0, high: 100}}, max_turns: 6}}"])
    assert cfg.env.name == NAME and cfg.env.params == {"low": 0, "high": 100}
    assert make_env(cfg.env.name, cfg.env.params, tokenizer=TOK)(TOK).stop_strings == ("</guess>",)
