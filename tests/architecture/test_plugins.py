"""The RL step asks no plug-in which one it got (issue 26, item 1; `jaxrl.rl`).

The policy (dense, LoRA, per-role adapters), the collector and the update schedule (joint, phased) are
resolved once at setup; the step calls them. A probe (`getattr` / `hasattr` / `isinstance`) or a read of a
feature's field in the step would bring the branches back.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBES = {"getattr", "hasattr", "isinstance"}
# the `Run` fields the plug-ins replaced (`Policy`: the first four; `UpdateSchedule`: the phases)
FEATURE_FIELDS = ("role_adapters", "base", "base_sha256", "ref_params", "update_phases")


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _run_attributes(path: Path) -> set[str]:
    """The attributes read off a name `run` (`run.x`)."""
    tree = ast.parse(path.read_text())
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "run"}


def test_the_step_and_the_schedules_probe_nothing():
    for name in ("jaxrl/rl_step.py", "jaxrl/rl/update.py"):
        assert not PROBES & _calls(ROOT / name), name


def test_the_step_and_the_loop_read_no_feature_field_of_the_run():
    for name in ("jaxrl/rl_step.py", "jaxrl/rl/update.py", "jaxrl/train_loop.py"):
        assert not set(FEATURE_FIELDS) & _run_attributes(ROOT / name), name
