"""Compile hygiene at scale: no "Involuntary full rematerialization" for the mesh axes of any shipped config.

Such a warning means GSPMD could not move a tensor between two shardings and replicated it instead: at pod
scale an all-gather of a whole tensor every step. Each shipped RL config is reduced (same family flags, remat,
norm, dtype, mesh axes; tiny sizes) and its train step, log-prob pass and rollout are compiled on 8 fake CPU
devices by `compile_hygiene_worker.py`, in one subprocess per mesh layout (its configs one after another,
without a persistent compilation cache), whose stderr (the compiler's log) is read here.

Mesh axes on 8 devices: data x fsdp -> 2 x 4, fsdp only -> 1 x 8, tensor -> 1 x 4 x 2, one device -> 1 x 1.
The first test of a layout runs that layout's whole worker: the 1 x 8 one compiles four configs (about 20 s
of CPU each), so its first config's test takes four times as long as the one-config layouts'. The 8-device
worker also compiles a positive control (`compile_hygiene_worker.probe`): a program GSPMD must warn about,
which shows that the worker's compiler flags still produce the warning and that this file reads it.
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
PROBE, PROBE_MESH = "PROBE", (1, 8, 1)  # the positive control's section, in the 8-device fsdp worker
# One worker process per mesh layout compiles each of that layout's configs in turn (importing jax and jaxrl
# and starting 8 fake devices once, not once per config); the worker's `main` reads its argv, which is set per
# config. A line "=== NAME" on stdout and stderr starts each config's section; a config that raises prints
# its traceback there and the next config still runs. The name PROBE runs the worker's `probe` instead.
DRIVER = """
import runpy, sys, traceback
worker, mesh, names = sys.argv[1], sys.argv[2:5], sys.argv[5:]
sys.argv = [worker, names[0], *mesh]
module = runpy.run_path(worker)  # sets XLA_FLAGS (the device count) before it imports jax
for name in names:
    for stream in (sys.stdout, sys.stderr):
        print("=== " + name, file=stream, flush=True)
    sys.argv = [worker, name, *mesh]
    try:
        module["probe" if name == "PROBE" else "main"]()
    except BaseException:
        traceback.print_exc()
        print("FAILED", flush=True)
"""


def _sections(text: str) -> dict[str, str]:
    out, name = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("=== "):
            name = line[4:].strip()
            out[name] = ""
        elif name is not None:
            out[name] += line
    return out


@pytest.fixture(scope="module")
def compiled():
    """mesh -> (returncode, {config path: stdout section}, {config path: stderr section}), on demand."""
    done = {}

    def get(mesh: tuple[int, int, int]):
        if mesh not in done:
            names = [str(ROOT / "configs" / n) for n in sorted(CONFIGS) if CONFIGS[n] == mesh]
            names += [PROBE] if mesh == PROBE_MESH else []  # after the configs: their sections come first
            # no persistent compilation cache: a cached executable is not compiled again, so its warnings
            # would not be printed
            env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
            p = subprocess.run([sys.executable, "-c", DRIVER, str(WORKER), *map(str, mesh), *names], env=env,
                               capture_output=True, text=True, timeout=1800, cwd=ROOT)
            done[mesh] = (p.returncode, _sections(p.stdout), _sections(p.stderr))
        return done[mesh]

    return get


def test_every_mesh_layout_is_covered():
    layouts = set(CONFIGS.values())
    assert (1, 8, 1) in layouts and (2, 4, 1) in layouts, layouts


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_no_involuntary_rematerialization(name, compiled):
    data, fsdp, tensor = CONFIGS[name]
    returncode, out, err = compiled(CONFIGS[name])
    key = str(ROOT / "configs" / name)
    assert returncode == 0 and key in err, (returncode, list(err))
    assert out[key].split() == "compiled log-prob pass compiled train step compiled rollout".split(), \
        err[key][-3000:]
    warnings = [line[:400] for line in err[key].splitlines() if WARNING in line]
    where = f"{name} on data x fsdp x tensor = {data} x {fsdp} x {tensor}"
    assert not warnings, where + ":\n" + "\n".join(warnings)


@pytest.mark.slow
def test_worker_reports_a_known_rematerialization(compiled):
    """The positive control: with the worker's compiler flags, a program that needs an involuntary full
    rematerialization prints the warning this file looks for, in its own section."""
    returncode, out, err = compiled(PROBE_MESH)
    assert returncode == 0 and PROBE in err, (returncode, list(err))
    assert out[PROBE].split() == ["compiled", "probe"], err[PROBE][-3000:]
    assert any(WARNING in line for line in err[PROBE].splitlines()), err[PROBE][-3000:]
