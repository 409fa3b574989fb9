"""An environment searching another world than its data's questions is refused at setup (issue 30 item 8):
the config check for the built-in worlds (env search, multi_agent march, data.source entities), one line and
exit 2 from the CLI; the search env's own check of a generated record (data from a file or another source)."""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl import config as config_lib
from jaxrl.config import load_config
from jaxrl.data import tasks
from jaxrl.data.entities import build_world
from jaxrl.envs import EpisodeBudget, SearchEnv, scripted_episodes
from jaxrl.errors import ConfigError, EnvError
from jaxrl.multi_agent.march import MarchSystem
from jaxrl.io.tokenizer import builtin_tokenizer

REPO = Path(__file__).resolve().parents[2]
TOK = builtin_tokenizer()


@pytest.mark.parametrize("config, override, key", [
    ("search_tiny", "env.params.corpus_size=tiny", "env.params"),
    ("search_tiny", "data.params.corpus_seed=3", "env.params"),
    ("march_tiny", "multi_agent.params.corpus_seed=1", "multi_agent.params"),
])
def test_config_with_another_world_is_refused(config, override, key):
    with pytest.raises(ConfigError, match=rf"{key}.\(corpus_seed, corpus_size\)=.*differs from data.params'"):
        load_config(REPO / f"configs/{config}.yaml", [override])
    load_config(REPO / f"configs/{config}.yaml", [])  # the shipped configs agree


def test_world_defaults_are_the_constructors():
    for fn in (tasks.entities, SearchEnv.__init__, MarchSystem.__init__):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in config_lib.WORLD_DEFAULTS} == config_lib.WORLD_DEFAULTS, fn
    # unset on both sides means the same (default) world: accepted
    load_config(REPO / "configs/search_tiny.yaml", ["data.params={max_hops: 1}", "env.params={top_k: 1}"])


def test_search_env_refuses_a_record_of_another_world():
    other = build_world(0, "tiny").records("train")[:2]
    spec = EpisodeBudget(max_turns=2, max_total_tokens=512, row_buckets=(512,))
    factory = lambda tok: SearchEnv(tok, corpus_seed=0, corpus_size="rooms")
    with pytest.raises(EnvError, match=r"SearchEnv.reset: the record .* is not a question of the env's world "
                                       r"\(corpus_seed=0, corpus_size='rooms'\)"):
        scripted_episodes(other, TOK, factory, lambda r: ["<answer>x</answer>"], spec)
    own = build_world(0, "rooms").records("train")[:2]
    eps = scripted_episodes(own, TOK, factory, lambda r: [f"<answer>{r['answers'][0]}</answer>"], spec)
    assert eps.rewards_B.tolist() == [1.0, 1.0]


def test_cli_refuses_it_in_one_line_before_anything_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "jaxrl.cli", "train", str(REPO / "configs/search_tiny.yaml"),
                           "--set", "env.params.corpus_size=tiny", "--run-dir", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "another world" in proc.stderr
    assert not (tmp_path / "run").exists()
