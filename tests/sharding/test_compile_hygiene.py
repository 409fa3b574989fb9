"""Compile hygiene at scale: no "Involuntary full rematerialization" for the mesh axes of any shipped config.

Such a warning means GSPMD could not move a tensor between two shardings and replicated it instead: at pod
scale an all-gather of a whole tensor every step. Each shipped RL config is reduced (same family flags, remat,
norm, dtype, mesh axes; tiny sizes) and its train step, log-prob pass and rollout are compiled on 8 fake CPU
devices by `compile_hygiene_worker.py` in a subprocess, whose stderr (the compiler's log) is read here.

Mesh axes on 8 devices: data x fsdp -> 2 x 4, fsdp only -> 1 x 8, tensor -> 1 x 4 x 2, one device -> 1 x 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("compile_hygiene_worker.py")
WARNING = "Involuntary full rematerialization"


def _eight_device_mesh(mesh: dict) -> tuple[int, int, int]:
    data, fsdp, tensor = (mesh.get(k, d) for k, d in (("data", 1), ("fsdp", -1), ("tensor", 1)))
    if tensor not in (1, -1):
        return 1, 4, 2
    if data not in (1, -1) and fsdp not in (1,):
        return 2, 4, 1
    if fsdp == 1 and data in (1,):
        return 1, 1, 1
    return 1, 8, 1


def _rl_configs() -> dict[str, tuple[int, int, int]]:
    """Shipped RL configs (those with a `rollout:` section) and their 8-device mesh; one per distinct case."""
    out, seen = {}, set()
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "rollout" not in raw:
            continue  # reward-model configs (jaxrl train-rm)
        mesh = _eight_device_mesh(raw.get("mesh") or {})
        m = raw.get("model") or {}
        family = Path(m.get("hf_path") or m.get("preset") or "").name.lower()
        key = (family.split("-")[0], m.get("remat"), m.get("norm"), m.get("dtype"), mesh)
        if key not in seen:
            seen.add(key)
            out[path.name] = mesh
    return out


CONFIGS = _rl_configs()


def test_every_mesh_layout_is_covered():
    layouts = set(CONFIGS.values())
    assert (1, 8, 1) in layouts and (2, 4, 1) in layouts, layouts


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_no_involuntary_rematerialization(name):
    data, fsdp, tensor = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run([sys.executable, str(WORKER), str(ROOT / "configs" / name), str(data), str(fsdp),
                        str(tensor)], env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == "compiled log-prob pass compiled train step compiled rollout".split()
    warnings = [line[:400] for line in p.stderr.splitlines() if WARNING in line]
    where = f"{name} on data x fsdp x tensor = {data} x {fsdp} x {tensor}"
    assert not warnings, where + ":\n" + "\n".join(warnings)
