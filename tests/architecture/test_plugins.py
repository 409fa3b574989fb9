"""The RL step asks no plug-in which one it got (issue 26, item 1; `jaxrl.rl`).

The policy (dense, LoRA, per-role adapters), the collector and the update schedule (joint, phased) are
resolved once at setup; the step calls them. A probe (`getattr` / `hasattr` / `isinstance`) or a read of a
feature's field in the step would bring the branches back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = {"getattr", "hasattr", "isinstance"}
# the `Run` fields the plug-ins replaced (`Policy`: the first four; `UpdateSchedule`: the phases;
# `Collector`: the last three)
FEATURE_FIELDS = ("role_adapters", "base", "base_sha256", "ref_params", "update_phases", "env_factory",
                  "episode_spec", "multi_agent")


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _run_attributes(path: Path) -> set[str]:
    """The attributes read off a name `run` (`run.x`)."""
    tree = ast.parse(path.read_text())
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "run"}


def test_the_step_and_the_schedules_probe_nothing():
    for name in ("jaxrl/rl/step.py", "jaxrl/rl/update.py", "jaxrl/rl/critic.py"):
        assert not PROBES & _calls(ROOT / name), name


def test_the_step_and_the_loop_read_no_feature_field_of_the_run():
    for name in ("jaxrl/rl/step.py", "jaxrl/rl/update.py", "jaxrl/rl/loop.py", "jaxrl/rl/warm_start.py"):
        assert not set(FEATURE_FIELDS) & _run_attributes(ROOT / name), name


# The feature probes the plug-ins replaced: any `hasattr`, and a `getattr` with a default or a literal name
# (reading a dataclass field by its computed name, `getattr(batch, field.name)`, is no probe).
PROBED_FILES = ("jaxrl/rl/run.py", "jaxrl/rl/setup.py", "jaxrl/rl/batch.py", "jaxrl/rl/step.py",
                "jaxrl/rl/loop.py", "jaxrl/rl/warm_start.py")


def _probes(path: Path) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            continue
        literal = len(n.args) > 1 and isinstance(n.args[1], ast.Constant)
        if n.func.id == "hasattr" or (n.func.id == "getattr" and (len(n.args) > 2 or literal)):
            out.append(f"{path.name}:{n.lineno}: {ast.unparse(n)}")
    return out


def test_setup_the_step_and_the_loop_probe_no_feature():
    assert [p for name in PROBED_FILES for p in _probes(ROOT / name)] == []


def test_the_run_holds_the_plug_ins_not_the_feature_fields_they_replaced():
    import dataclasses

    from jaxrl.rl.run import Run

    fields = {f.name for f in dataclasses.fields(Run)}
    assert {"policy", "collector", "schedule"} <= fields
    assert not set(FEATURE_FIELDS) & fields


@pytest.mark.parametrize("config, collector, name", [
    ("configs/quickstart.yaml", "SingleTurn", "single_turn"),
    ("configs/search_tiny.yaml", "EnvEpisodes", "env_episodes"),
    ("configs/march_tiny.yaml", "SystemRows", "march"),
    ("configs/ssp_tiny.yaml", "SystemRows", "ssp"),
])
def test_setup_resolves_the_collector_of_the_config(config, collector, name, tmp_path):
    """One collector per config, chosen at setup. Its name keys its state in checkpoints: SSP's pool stays
    under "ssp" (`extra["stages"]["ssp"]`, as before the collector plug-in), so older checkpoints resume."""
    from jaxrl.rl import setup as rl_setup
    from jaxrl.config import load_config
    from jaxrl.rl import collect

    run, _, _ = rl_setup.setup(load_config(str(ROOT / config)), tmp_path)
    assert type(run.collector) is getattr(collect, collector)
    assert run.collector.name == name
    assert run.collector.segments == (collector == "SystemRows")
    assert (run.collector.demonstrations() is None) == (collector == "SingleTurn")
    if name == "ssp":
        assert run.collector.state_json() is not None  # the pool (failed_slots: reuse)
    else:
        assert run.collector.state_json() is None


def test_the_rl_middle_is_one_package_of_small_files():
    """Issue 26 item 2: setup, run, step, batch, warm start and loop live in `jaxrl/rl/` (the top-level
    `trainer.py`, `rl_step.py` and `train_loop.py` are gone), no file there past 400 lines."""
    rl = ROOT / "jaxrl" / "rl"
    names = {p.name for p in rl.glob("*.py")}
    assert {"setup.py", "run.py", "step.py", "batch.py", "warm_start.py", "loop.py"} <= names, names
    assert not [n for n in ("trainer.py", "rl_step.py", "train_loop.py") if (ROOT / "jaxrl" / n).exists()]
    lines = {p.name: len(p.read_text().splitlines()) for p in rl.glob("*.py")}
    assert max(lines.values()) <= 400, lines
