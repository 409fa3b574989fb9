"""`jaxrl train configs/march_tiny.yaml`, shortened: the MARCH pipeline runs from the config alone, in the
reference's faithful mode (spec/multi-agent.md §1.7, §5.1): PPO with a critic and GAE (γ 0.998, λ 1) over the
joint Solver + Checker batch, k1 KL in the reward per token (β 0.1), PPO clip 0.2 / 0.2 with dual clip 3,
value clip 0.5, critic warm-up (the reference's 10 steps, 1 here), one sample per prompt.

One CPU device in a subprocess (as tests/train), a one-layer model (D = 32), one SFT warm-start step on the
role demonstrations (it compiles the SFT step once: more steps draw rows of other lengths, another compile)
and two RL steps. The assertions are on the wiring, not on learning (too short for that; docs/multi_agent.md
has the full run): every RL step logs the three roles' metrics, the Solver's mean reward is its answer reward
plus the fact-check reward (R = r_RM + r_fc, the reference's sum), rates are rates, step 1 trains the critic
only and step 2 both, and greedy evaluation reports the answer, fact-check and hallucination columns
(accuracy = the answer reward's mean), which `jaxrl eval` of the run's checkpoint reproduces exactly. The GRPO
variant (critic-free, the config's own) runs in tests/sharding/test_multihost_cli.py and experiments/.
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

ROOT = Path(__file__).resolve().parents[2]
CACHE = suite_cache_dir()
# one layer, D = 32: compiling dominates these runs and a program's compile time grows with the layers
SMALL_MODEL = ("{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16, mlp_dim: 64, "
               "max_position_embeddings: %d}")
SHORT = ("sft_warmup.steps=1", "sft_warmup.batch_size=6", "train.steps=2", "train.eval_every=2",
         "data.prompts_per_step=2", "data.eval_size=2", "rollout.group_size=2", "rollout.max_new_tokens=40",
         "rollout.gen_buckets=[40]", "logging.progress_bar=false", "logging.tensorboard=false",
         "checkpoint.every=1000", "checkpoint.async_save=false", "model.overrides=" + SMALL_MODEL % 640)
ROLE_KEYS = ("role/solver/reward/mean", "role/checker/reward/mean", "role/proposer/pairs/mean",
             "role/solver/response_length/mean", "role/checker/response_length/mean",
             "role/proposer/response_length/mean", "march/hallucination_rate", "reward/fact_check/mean")


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e.update(XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(CACHE), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return e


def _train_rows(config: str, overrides, run_dir) -> list[dict]:
    """`jaxrl train configs/CONFIG` with `overrides` in a subprocess; the rows of its metrics.jsonl."""
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", str(ROOT / "configs" / config),
           *[a for o in overrides for a in ("--set", o)], "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


# MARCH's faithful mode (docs/multi_agent.md, "PPO + GAE"): the reference's estimator and settings
FAITHFUL = ("algorithm.name=ppo", "algorithm.ppo.gamma=0.998", "algorithm.ppo.lam=1.0", "algorithm.ppo.value_clip=0.5",
            "algorithm.ppo.whiten=true", "algorithm.kl.beta=0.1", "algorithm.kl.where=reward", "algorithm.kl.kind=k1",
            "algorithm.clip={low: 0.2, high: 0.2, dual: 3.0}", "algorithm.agg_mode=token-mean",
            "multi_agent.params.train_roles=[solver, checker]")


@pytest.mark.slow  # ~70 CPU-seconds over its two CLI processes (compiles dominate)
def test_march_tiny_trains_from_config_in_the_faithful_mode(tmp_path):
    rows = _train_rows("march_tiny.yaml", (*SHORT, *FAITHFUL, "rollout.group_size=1",
                                           "algorithm.ppo.critic_warmup_steps=1"), tmp_path / "march")
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    # step 1: the critic's warm-up (no actor update); step 2: both, with the KL to the reference in the reward
    assert [r["critic/warmup"] for r in train] == [1.0, 0.0] and "loss" not in train[0] and "loss" in train[1]
    assert all(r["critic/vf_loss"] > 0 and np.isfinite(r["kl"]) for r in train), train
    assert train[1]["train/grad_norm"] > 0 and "role/checker/response_length/mean" in train[1]
    for r in train:
        missing = [k for k in ROLE_KEYS if k not in r]
        assert not missing, missing
        assert r["role/solver/reward/mean"] == pytest.approx(
            r["role/solver/correct/mean"] + r["reward/fact_check/mean"], abs=1e-5)
        assert 0.0 <= r["march/hallucination_rate"] <= 1.0 and -1.0 <= r["reward/fact_check/mean"] <= 0.0
        assert r["march/labelled_frac"] in (0.0, 0.5, 1.0)  # 2 prompts: each is fact-checked or not
        if r["role/checker/reward/mean"] is not None:  # NaN (written as null): no chain had a claim
            assert -1.0 <= r["role/checker/reward/mean"] <= 0.0
    evals = {r["step"]: r for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [0, 2]
    for r in evals.values():
        assert r["eval/accuracy"] == pytest.approx(r["eval/reward/answer/mean"])
        assert -1.0 <= r["eval/reward/fact_check/mean"] <= 0.0
        assert 0.0 <= r["eval/reward/hallucination/mean"] <= 1.0
    # `jaxrl eval` of the final checkpoint runs the run's own collector (MARCH's held-out Solver rows, fact
    # check and hallucination columns, k = 4 samples as the config's eval_samples) and reproduces the
    # training-time numbers of step 2 exactly (issue 30 item 4)
    proc = subprocess.run([sys.executable, "-m", "jaxrl.cli", "eval", "--checkpoint", str(tmp_path / "march"),
                           "--k", "4"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, last = json.loads(proc.stdout), {k: v for k, v in evals[2].items() if k.startswith("eval/")}
    assert "eval/avg@4" in last and {k: out.get(k) for k in last} == last, (out, last)


# the same one-layer model (the config's 4 layers of D = 128 compiled most of this test's time)
SSP_SHORT = ("sft_warmup.steps=1", "sft_warmup.batch_size=6", "train.steps=2", "train.eval_every=2",
             "data.prompts_per_step=2", "data.eval_size=2", "rollout.group_size=2",
             "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.every=1000",
             "checkpoint.async_save=false", "model.overrides=" + SMALL_MODEL % 512)
REASONS = ("format", "length", "leak", "materials", "searches", "grounded")


@pytest.mark.slow  # ~47 CPU-seconds (was ~65 with the config's 4-layer model)
def test_ssp_tiny_trains_from_config(tmp_path):
    """The SSP skeleton from configs/ssp_tiny.yaml: curriculum metrics logged, every proposal is valid,
    rejected by one rule or by the RAG check (the shares sum to 1). The sequential schedule updates the
    Proposer, then the Solver with old log-probs taken after the Proposer's update, so the Solver phase's
    PPO ratio starts at exactly 1 (the sampler's log-probs, from before that update, would not give 1).
    """
    # an entropy bonus gives both phases a gradient even when every reward is 0 (a 1-step warm start)
    rows = _train_rows("ssp_tiny.yaml", (*SSP_SHORT, "algorithm.entropy_coef=0.01"), tmp_path / "ssp")
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        shares = [r[f"ssp/invalid/{k}"] for k in REASONS] + [r["ssp/rag_rejected"], r["ssp/valid_frac"]]
        assert sum(shares) == pytest.approx(1.0)
        assert 0.0 <= r["role/solver/reward/mean"] <= 1.0 and 0.0 <= r["role/proposer/reward/mean"] <= 1.0
        assert r["loss"] == pytest.approx((r["role/proposer/loss"] + r["role/solver/loss"]) / 2, abs=1e-6)
        assert abs(r["role/solver/pg/approx_kl"]) < 1e-6 and r["role/solver/pg/ratio_mean"] == pytest.approx(1.0)
        assert r["role/proposer/train/grad_norm"] > 0 and r["role/solver/train/grad_norm"] > 0
    # the problem pool is checkpointed with the run (exact resume draws the same reused problems)
    extra = [json.loads(f.read_text()) for f in (tmp_path / "ssp" / "checkpoints" / "2" / "extra").rglob("*")
             if f.is_file() and b'"stages"' in f.read_bytes()]
    assert len(extra) == 1 and extra[0]["stages"]["ssp"]["steps"] == 2
    # After a 1-step warm start every proposal fails (the format rule): each failed slot takes the dummy problem
    # (the pool is empty), and dummies are never pushed, so the pool stays empty and is checkpointed empty. (A
    # non-empty pool's draws, clear and round trip: test_ssp_system.test_problem_pool_draws_eligible_problems_...)
    assert all(r["ssp/dummy"] == 1.0 and r["ssp/reused"] == 0.0 and r["ssp/pool_size"] == 0.0 for r in train)
    assert extra[0]["stages"]["ssp"]["problems"] == []
    assert sorted(r["step"] for r in rows if "eval/accuracy" in r) == [0, 2]
