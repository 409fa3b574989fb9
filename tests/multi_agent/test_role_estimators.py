"""Per-role advantage estimators (`multi_agent.estimators: {role: algorithm}`).

Unit: `segment_advantages` runs a role's own estimator on that role's rows (RLOO by hand on one segment, the
run's GRPO on the other); the config refuses non-estimator algorithms, a run algorithm with group-wide stages
and a per-reward estimator under a KL penalty in the reward; setup refuses a role the system does not train
and a role group the estimator cannot handle.
CLI (`configs/march_tiny.yaml`, shrunk, no warm start; only the Solver is trained): GRPO with
`estimators: {solver: rloo}` equals `algorithm.name=rloo` step for step and differs from plain GRPO; an
untrained role is refused (exit 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests._xla import suite_cache_dir, xla_flags

from jaxrl.algorithms import ALGORITHMS, AlgoSettings, segment_advantages
from jaxrl.config import AlgorithmConfig, load_config
from jaxrl.errors import ConfigError
from jaxrl.rl.setup import _check_role_groups

ROOT = Path(__file__).resolve().parents[2]
MARCH = str(ROOT / "configs" / "march_tiny.yaml")


def test_each_role_segment_uses_its_own_estimator():
    rewards = np.asarray([1, 0, 0, 1, 1, 0, 3, 1], np.float32)[:, None]  # role 0: one group of 4; role 1: 2 of 2
    segment = np.asarray([0, 0, 0, 0, 1, 1, 1, 1])
    mask = np.ones((8, 3), bool)
    s = AlgoSettings(group_size=4, eps=1e-6, clip_low=0.2, clip_high=0.28, section=AlgorithmConfig())
    grpo, rloo = ALGORITHMS["grpo"].advantages, ALGORITHMS["rloo"].advantages
    ones = np.ones((1,), np.float32)
    out = segment_advantages(grpo, rewards, ones, mask, s, segment, (4, 2), estimators=(rloo, None))
    # RLOO: r_i minus the mean of the other three of its group
    np.testing.assert_allclose(out.adv_BT[:4, 0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
    s2 = AlgoSettings(group_size=2, eps=1e-6, clip_low=0.2, clip_high=0.28, section=AlgorithmConfig())
    np.testing.assert_allclose(out.adv_BT[4:], grpo(rewards[4:], ones, mask[4:], s2).adv_BT, rtol=1e-6)
    plain = segment_advantages(grpo, rewards, ones, mask, s, segment, (4, 2))
    assert not np.allclose(plain.adv_BT[:4], out.adv_BT[:4])  # GRPO's scale differs from RLOO's
    np.testing.assert_array_equal(plain.adv_BT[4:], out.adv_BT[4:])


@pytest.mark.parametrize("overrides, key, message", [
    (["multi_agent.estimators={solver: ppo}"], "multi_agent.estimators.solver", "allowed values are 'grpo'"),
    (["multi_agent.estimators={solver: dapo}"], "multi_agent.estimators.solver", "allowed values"),
    (["multi_agent.estimators={solver: rloo}", "algorithm.name=dapo"], "algorithm.name",
     "without resampling, reward shaping, extra rows or a critic"),
    # a critic's GAE reads every trained role's per-token rewards, not another estimator's advantages
    (["multi_agent.estimators={solver: rloo}", "algorithm.name=ppo"], "algorithm.name", "or a critic"),
    (["multi_agent.estimators={solver: gdpo}", "algorithm.kl.beta=0.1", "algorithm.kl.where=reward"],
     "multi_agent.estimators.solver", "use algorithm.kl.where: loss"),
])
def test_config_refuses_what_a_role_estimator_cannot_be(overrides, key, message):
    with pytest.raises(ConfigError) as err:
        load_config(MARCH, overrides)
    assert key in str(err.value) and message in str(err.value), str(err.value)


def test_setup_checks_each_role_group_against_its_own_estimator():
    rloo = ALGORITHMS["rloo"]
    _check_role_groups({"proposer": 1, "solver": 4}, ALGORITHMS["grpo"], "ssp", estimators={"solver": rloo})
    with pytest.raises(ConfigError, match=r"multi_agent.estimators.proposer='rloo': needs groups of >= 2"):
        _check_role_groups({"proposer": 1, "solver": 4}, ALGORITHMS["grpo"], "ssp",
                           estimators={"proposer": rloo})
    # the run's RLOO cannot handle the Proposer's groups of one, GRPO as the Proposer's own estimator can
    _check_role_groups({"proposer": 1, "solver": 4}, rloo, "ssp", estimators={"proposer": ALGORITHMS["grpo"]})


SMALL = (("model.overrides={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16, "
          "mlp_dim: 64, max_position_embeddings: 640}"),
         # no SFT warm start: the rewards below vary on an untrained policy, and 2 warm-start steps left it as
         # untrained (same rewards, entropy 4.62) while compiling the SFT step in each of the three runs
         "sft_warmup.steps=0", "train.steps=2", "train.eval_every=0",
         "data.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16",
         "rollout.gen_buckets=[16]", "logging.progress_bar=false", "logging.tensorboard=false",
         "checkpoint.every=100", "optimizer.lr=1e-2",
         # rewards that vary on an untrained policy, so the groups have a spread to estimate from
         ("rewards=[{name: digit, type: format, weight: 1.0, params: {pattern: '.*[0-9].*'}},"
          " {name: short, type: length, weight: 0.5, params: {target: 4}}]"))


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`jaxrl train` of the shrunk config; the suite's compile cache, every program in it (not only those over
    1 s to compile), so that the second and third runs load the first one's programs their own settings share."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_CACHE")} | {"XLA_FLAGS": xla_flags()}
    env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               JAX_COMPILATION_CACHE_DIR=str(suite_cache_dir()), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    sets = [a for o in (*SMALL, *overrides) for a in ("--set", o)]
    return subprocess.run([sys.executable, "-m", "jaxrl.cli", "train", MARCH, "--run-dir", str(run_dir), *sets],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.mark.slow  # three shrunk CLI trainings (no warm start)
def test_solver_estimator_equals_the_run_algorithm_it_names(tmp_path):
    runs = {}
    for name, extra in (("own", ("multi_agent.estimators={solver: rloo}",)), ("rloo", ("algorithm.name=rloo",)),
                        ("grpo", ())):
        done = _train(tmp_path / name, *extra)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = _steps(tmp_path / name)
    assert len(runs["own"]) == 2
    for got, want in zip(runs["own"], runs["rloo"], strict=True):  # the Solver is the only trained role
        for key in ("loss", "reward/mean", "entropy"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    assert any(a["loss"] != pytest.approx(b["loss"], rel=1e-4) for a, b in zip(runs["own"], runs["grpo"]))


def test_a_role_the_system_does_not_train_is_refused(tmp_path):
    done = _train(tmp_path / "bad", "multi_agent.estimators={checker: rloo}")
    assert done.returncode == 2, done.stderr[-2000:]
    line = "multi_agent.estimators.checker: not a trained role of march (trained roles: solver)"
    assert line in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()
