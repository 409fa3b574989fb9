"""Observability of `jaxrl train` (issue 31 items 2-6), in ONE tiny CLI run without a terminal and without torch:

* every step's row holds the stage breakdown (`time/*`) and tokens/s per device; no MFU on CPU;
* `--profile 2:2` writes a jax.profiler trace naming the train step;
* no bar frames in a log: plain lines every `logging.every` steps (+ the last) and one line per phase;
* stderr holds only jaxrl's own lines (no "PyTorch was not found" from transformers on a core-only install);
* the run summary on stdout and in RUN/run_summary.json; `jaxrl plot` draws the stacked breakdown.

A core-only install is simulated with a `sitecustomize` that sets `sys.modules["torch"] = None`: transformers
5 finds torch with `importlib.util.find_spec`, which then returns None, so it logs its no-PyTorch warning.
"""

import gzip
import json
import re
import subprocess
import sys

import pytest

from _common import ROOT, env, train_cmd

from jaxrl.runtime import step_time
from jaxrl.errors import UserError

# logging.basicConfig's format in jaxrl/commands/train.py, from a jaxrl logger
OWN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) jaxrl(\.\w+)*: ")


def _no_torch_env(tmp_path) -> dict[str, str]:
    site = tmp_path / "no_torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    e = env()
    e["PYTHONPATH"] = f"{site}:{e['PYTHONPATH']}"
    return e


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("observe")
    e = _no_torch_env(tmp)
    check = subprocess.run([sys.executable, "-c", "import transformers, importlib.util as u; "
                            "print(u.find_spec('torch'))"], cwd=ROOT, env=e, capture_output=True, text=True)
    assert check.stdout.strip() == "None" and "PyTorch was not found" in check.stderr, "torch still visible"
    helped = subprocess.run([sys.executable, "-m", "jaxrl.cli", "--help"], cwd=ROOT, env=e, capture_output=True,
                            text=True, timeout=60)
    run_dir = tmp / "run"
    cmd = train_cmd(run_dir, "train.steps=3", "train.eval_every=2", "checkpoint.every=2", "logging.every=2",
                    "logging.progress_bar=true") + ["--profile", "2:2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return helped, proc, run_dir, rows


def test_help_and_train_print_only_jaxrl_lines_on_stderr(run):
    helped, proc, _, _ = run
    assert helped.returncode == 0 and helped.stderr == "" and "train" in helped.stdout
    foreign = [line for line in proc.stderr.splitlines() if not OWN_LINE.match(line)]
    assert not foreign, foreign
    assert "\r" not in proc.stderr + proc.stdout  # no progress-bar frames without a terminal


def test_plain_lines_every_n_steps_and_one_line_per_phase(run):
    _, proc, run_dir, _ = run
    steps = re.findall(r"jaxrl\.runtime\.metrics: (step \d+/3: .*)", proc.stderr)
    assert [s.split(":")[0] for s in steps] == ["step 0/3", "step 2/3", "step 3/3"]  # every 2nd step + the last
    assert "reward/mean" in steps[1] and "loss" in steps[1] and "eval/accuracy" in steps[1]
    assert "time/step" in steps[1] and "eval/accuracy" not in steps[2]
    for phase in ("evaluation at step 0: held-out accuracy", "evaluation at step 2: held-out accuracy",
                  f"checkpoint: step 2 saved in {run_dir / 'checkpoints'}", "checkpoint: step 3 saved",
                  f"profile of steps 2-2 written to {run_dir / 'profile'}"):
        assert phase in proc.stderr, phase


def test_every_step_has_the_time_breakdown(run):
    rows = run[3]
    train = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        stages = [r[f"time/{s}"] for s in (*step_time.STAGES, "eval", "checkpoint", "other")]
        assert all(s >= 0 for s in stages)
        assert r["time/generation"] > 0 and r["time/update"] > 0 and r["time/old_logprobs"] > 0
        assert r["time/env"] == 0 and r["time/ref_logprobs"] == 0  # no environment, no KL reference
        assert r["time/teacher_logprobs"] == 0  # no distillation teacher
        assert sum(stages) == pytest.approx(r["time/step"], rel=1e-6, abs=1e-6)  # `other` closes the sum
        for stage in ("generation", "update"):
            assert r[f"throughput/tokens_per_s_per_device/{stage}"] > 0
        assert "throughput/mfu/update" not in r  # the CPU's peak FLOP/s is unknown
    assert train[1]["time/eval"] > 0 and train[0]["time/eval"] == 0
    assert train[2]["time/checkpoint"] > 0 and train[0]["time/checkpoint"] == 0  # the save after step 2


def test_profile_trace_names_the_train_step(run):
    run_dir = run[2]
    traces = list((run_dir / "profile").rglob("perfetto_trace.json.gz"))
    assert len(traces) == 1 and list((run_dir / "profile").rglob("*.xplane.pb"))
    events = json.loads(gzip.open(traces[0]).read())["traceEvents"]
    steps = [e for e in events if e.get("name") == "train"]
    assert [e["args"]["step_num"] for e in steps] == ["2"]
    assert {"collect", "update"} <= {e.get("name") for e in events}  # the stages are annotated too


def test_run_summary_on_stdout_and_in_the_run_directory(run, tmp_path):
    _, proc, run_dir, _ = run
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["steps"] == {"first": 1, "last": 3, "total": 3}
    assert summary["held_out_accuracy"]["last"]["step"] == 2
    assert summary["checkpoint"] == {"directory": str(run_dir / "checkpoints"), "step": 3}
    assert summary["export_hf"] == f"jaxrl export-hf --checkpoint {run_dir} --out {run_dir / 'hf'}"
    wall = summary["wall_s"]
    assert wall["total"] >= wall["setup"] + wall["rl_steps"] > 0 and wall["checkpoint"] > 0
    assert summary["step_stages_s"]["update"] > 0
    assert "run summary: steps 1-3 of 3" in proc.stdout and summary["export_hf"] in proc.stdout
    from jaxrl.runtime.plot import plot_runs

    assert tmp_path / "step_time.png" in plot_runs([run_dir], tmp_path)


def test_profile_steps_peak_flops_and_model_flops():
    assert step_time.parse_profile_steps("3:5") == (3, 5) and step_time.parse_profile_steps("4") == (4, 4)
    for bad in ("5:3", "0:2", "a", "1:2:3"):
        with pytest.raises(UserError):
            step_time.parse_profile_steps(bad)
    assert step_time.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert step_time.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert step_time.peak_flops("TPU v5 lite") == 197e12 and step_time.peak_flops("TPU v5") == 459e12
    assert step_time.peak_flops("TPU v6 lite") == 918e12 and step_time.peak_flops("cpu") is None
    from jaxrl.models import TransformerConfig

    cfg = TransformerConfig(vocab_size=10, hidden_size=4, num_layers=2, num_heads=2, num_kv_heads=1,
                            head_dim=2, mlp_dim=8)
    matmul_params = 2 * (4 * 2 * 2 * 2 + 4 * 1 * 2 * 2 + 3 * 4 * 8) + 4 * 10  # q,o + k,v + MLP, x layers + head
    assert step_time.train_flops_per_token(cfg, 0) == 6 * matmul_params  # 6N without attention
    assert step_time.train_flops_per_token(cfg, 0, lora=True) == 4 * matmul_params
    assert step_time.train_flops_per_token(cfg, 5) - step_time.train_flops_per_token(cfg, 0) == 6 * 2 * 2 * 2 * 2 * 5
