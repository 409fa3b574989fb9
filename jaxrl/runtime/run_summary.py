"""The summary `jaxrl train` ends with: steps, wall time by phase, held-out accuracy, checkpoint and export.

`train` writes it as RUN/run_summary.json (process 0, at the end of every invocation that reaches the end of
its loop, including one stopped by a signal); `jaxrl train` prints `lines(summary)` on stdout. Wall times are
this invocation's; held-out accuracies are read from the whole of RUN/metrics.jsonl (a resumed run's earlier
evaluations count).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from jaxrl.runtime.metrics import read_metrics

SUMMARY_FILE = "run_summary.json"


def held_out(run_dir: Path) -> dict[str, Any]:
    """{"last": {"step", "accuracy"}, "best": {...}} from RUN/metrics.jsonl's `eval/accuracy` rows (the first
    step that reached the best value); {} when the run never evaluated."""
    evals = [(r["step"], r["eval/accuracy"]) for r in read_metrics(run_dir)
             if isinstance(r.get("eval/accuracy"), (int, float)) and math.isfinite(r["eval/accuracy"])]
    if not evals:
        return {}
    best = max(evals, key=lambda e: (e[1], -e[0]))
    return {"last": {"step": evals[-1][0], "accuracy": evals[-1][1]},
            "best": {"step": best[0], "accuracy": best[1]}}


def export_command(checkpoint: str, run_dir: Path, *, lora: bool) -> str:
    """The `jaxrl export-hf` command of the run's latest checkpoint (LoRA: of its merged adapters)."""
    if lora:
        return f"jaxrl export-hf --checkpoint {run_dir / 'adapters'} --out {run_dir / 'hf'} --merge"
    return f"jaxrl export-hf --checkpoint {checkpoint} --out {run_dir / 'hf'}"


def write(run_dir: Path, summary: Mapping[str, Any]) -> Path:
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as a few plain lines."""
    st, wall = summary["steps"], summary["wall_s"]
    ran = f"steps {st['first']}-{st['last']} of {st['total']}" if st["last"] >= st["first"] else "no steps"
    names = ("setup", "warm_start", "rl_steps", "eval", "checkpoint")
    phases = ", ".join(f"{name.replace('_', ' ')} {_s(wall[name])}" for name in names if wall.get(name))
    out = [f"run summary: {ran} in {_s(wall['total'])} ({phases})"]
    stages = {k: v for k, v in summary.get("step_stages_s", {}).items() if v >= 0.05}
    if stages:
        out.append("  RL steps by stage: " + ", ".join(f"{k} {_s(v)}" for k, v in stages.items()))
    acc = summary.get("held_out_accuracy")
    if acc:
        out.append(f"  held-out accuracy: last {acc['last']['accuracy']:.3f} (step {acc['last']['step']}), "
                   f"best {acc['best']['accuracy']:.3f} (step {acc['best']['step']})")
    ck = summary["checkpoint"]
    out.append(f"  checkpoint: step {ck['step']} in {ck['directory']}")
    out.append(f"  export to Hugging Face: {summary['export_hf']}")
    out.append(f"  (also in {summary['file']})")
    return out
