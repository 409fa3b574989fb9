"""Per-role LoRA adapters (`multi_agent.adapters: per_role`, `jaxrl.multi_agent.adapters`).

Unit: the role policies merge each role's adapters once and resolve aliases (SSP's verifier is its Solver);
per-role state holds independent copies; a role's update replaces only that role.
CLI (`jaxrl train configs/march_tiny.yaml`, shrunk, LoRA): with only the Solver trained, the Proposer's and
Checker's adapters stay exactly the warm start's (equal to each other) while the Solver's move; a run killed
after step 2 (that run's directory as it was after its step-2 checkpoint) and relaunched resumes there and
reaches the uninterrupted run's step 3 exactly; per_role without `model.lora`, or
with reward shaping, is refused before any model is built (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from tests._xla import suite_cache_dir, xla_flags

from jaxrl.multi_agent import adapters as role_adapters
from jaxrl.learner.train_step import TrainState

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("model.overrides={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16, "
         "mlp_dim: 64, max_position_embeddings: 640}",
         # one warm-start step: one compile of the SFT step (more steps draw rows of other lengths)
         "sft_warmup.steps=1", "sft_warmup.batch_size=4", "train.eval_every=0", "data.prompts_per_step=2",
         "data.eval_size=4", "rollout.group_size=2", "rollout.max_new_tokens=16", "rollout.gen_buckets=[16]",
         "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.every=1",
         "checkpoint.async_save=false", "model.lora={rank: 4, alpha: 8}", "optimizer.lr=5e-2",
         # rewards that vary on an untrained policy, so the Solver's update is not zero
         "rewards=[{name: digit, type: format, weight: 1.0, params: {pattern: '.*[0-9].*'}},"
         " {name: short, type: length, weight: 0.5, params: {target: 4}}]",
         "multi_agent.adapters=per_role")


def test_role_policies_merge_once_per_role_and_resolve_aliases():
    calls = []
    policy = lambda adapters: calls.append(adapters) or {"merged": adapters}
    pol = role_adapters.RolePolicies({"proposer": 1, "solver": 2}, policy, {"verifier": "solver"})
    assert pol["solver"] == {"merged": 2} and pol["verifier"] is pol["solver"] and pol["solver"] is pol["solver"]
    assert calls == [2]  # merged once, the proposer not at all
    assert role_adapters.role_params(pol, "proposer") == {"merged": 1}
    assert role_adapters.role_params({"w": 0}, "proposer") == {"w": 0}  # shared params: the same for all
    with pytest.raises(KeyError, match="checker"):
        pol["checker"]


def test_per_role_state_copies_and_role_updates_are_independent():
    state = TrainState({"a": jnp.ones(3)}, {"m": jnp.zeros(3)}, jnp.asarray(5, jnp.int32))
    roles = role_adapters.per_role_state(state, ("solver", "checker"))
    assert set(roles.params) == {"solver", "checker"}
    pointers = {r: roles.params[r]["a"].unsafe_buffer_pointer() for r in roles.params}
    assert len(set(pointers.values()) | {state.params["a"].unsafe_buffer_pointer()}) == 3  # copies, not aliases
    sub = role_adapters.role_state(roles, "solver")
    moved = role_adapters.with_role_state(roles, "solver",
                                          TrainState({"a": sub.params["a"] + 1}, sub.opt_state, sub.step + 1))
    np.testing.assert_array_equal(moved.params["solver"]["a"], 2.0)
    np.testing.assert_array_equal(moved.params["checker"]["a"], 1.0)
    assert int(moved.step) == 6
    seeded = role_adapters.seed_roles(moved, {"a": jnp.full(3, 7.0)})
    assert all(float(seeded.params[r]["a"][0]) == 7.0 for r in ("solver", "checker"))


def _env() -> dict[str, str]:
    """The suite's compile cache, every program in it (not only those over 1 s to compile): the relaunched run
    loads the uninterrupted run's programs instead of compiling them again."""
    e = dict(os.environ)
    e.update(XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(suite_cache_dir()), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return e


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", str(ROOT / "configs" / "march_tiny.yaml"),
           "--run-dir", str(run_dir), *[a for o in SMALL + overrides for a in ("--set", o)]]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)


def _adapters(run_dir: Path, role: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    (file,) = (run_dir / "adapters" / role).glob("*.safetensors")
    return load_file(str(file))


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.slow  # two short runs of the shrunk MARCH config, ~2 minutes on 2 cores
def test_per_role_adapters_train_only_their_role_and_resume_exactly(tmp_path):
    full = tmp_path / "full"
    done = _train(full, "train.steps=3")
    assert done.returncode == 0, done.stderr[-3000:]
    solver, proposer, checker = (_adapters(full, r) for r in ("solver", "proposer", "checker"))
    assert solver.keys() == proposer.keys() == checker.keys() and solver
    for k in proposer:  # untrained roles: still the warm start's copy, bit for bit
        np.testing.assert_array_equal(proposer[k], checker[k], err_msg=k)
    assert any(not np.array_equal(solver[k], proposer[k]) for k in solver), "the Solver's adapters moved"
    rows = [r for r in _metrics(full) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("role/solver/loss" in r and "role/checker/loss" not in r for r in rows)
    assert any(r["role/solver/loss"] != 0 for r in rows)

    # The run as if killed right after its step-2 checkpoint (checkpoint.every=1, synchronous saves): the
    # uninterrupted run's directory without what steps after 2 wrote (checkpoint 3, metrics rows of step 3,
    # the adapters exported at the end). Relaunched, it resumes from step 2 (steps 1-2 are not run again)
    # and reaches the uninterrupted run's step 3 exactly. (A separate 2-step run cost a third CLI run.)
    part = tmp_path / "part"
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "3")
    shutil.rmtree(part / "adapters")
    rows_to_2 = [json.dumps(r) + "\n" for r in _metrics(part) if r["step"] <= 2]
    (part / "metrics.jsonl").write_text("".join(rows_to_2))
    assert sorted(int(c.name) for c in (part / "checkpoints").iterdir() if c.name.isdigit())[-1] == 2
    resumed = _train(part, "train.steps=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in _metrics(part) if "loss" in r] == [1, 2, 3]  # from step 2: step 3 ran once
    want = [r for r in _metrics(full) if r["step"] == 3][0]
    got = [r for r in _metrics(part) if r["step"] == 3][0]
    for key in ("loss", "reward/mean", "role/solver/loss", "entropy"):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    for role in ("solver", "proposer"):
        a, b = _adapters(full, role), _adapters(part, role)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{role} {k}")


@pytest.mark.parametrize("overrides, message", [
    (("model.lora=null",), "per_role adapters need model.lora"),
    (("algorithm.name=clipo",), "reward shaping"),
])
def test_per_role_refusals_exit_2_before_building(tmp_path, overrides, message):
    done = _train(tmp_path / "bad", "train.steps=1", *overrides)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()
