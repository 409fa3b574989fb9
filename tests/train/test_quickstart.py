"""The embedded default (configs/quickstart.yaml), shortened: RL raises held-out accuracy after warm-up.

Runs `jaxrl train` with no config file (the embedded default) in a subprocess on one CPU device, with its full
SFT warm start and 20 instead of 80 RL steps. The warm start's demonstrations use the required `<answer>` tags
only one time in four, so greedy held-out answers start mostly untagged (the strict answer reward scores them
0); RL must make the tagged answer the policy's choice. Fixed seeds make the run deterministic; the assertions
are on the learning effect (held-out format and accuracy after RL well above the warm start, training reward
rising), not on exact values.
"""

import subprocess
import sys

import pytest

from _common import ROOT, env, metrics

SHORT = ("train.steps=20", "train.eval_every=20", "logging.progress_bar=false",
         "logging.tensorboard=false", "checkpoint.every=1000", "checkpoint.async_save=false")


@pytest.mark.slow  # ~3 minutes on 2 cores (700 SFT steps + 20 RL steps of the 4-layer model)
def test_quickstart_held_out_accuracy_rises(tmp_path):
    run_dir = tmp_path / "qs"
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", *[a for o in SHORT for a in ("--set", o)],
           "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(run_dir)
    evals = {r["step"]: r for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [0, 20]
    before, after = evals[0], evals[20]
    assert before["eval/reward/format/mean"] < 0.5 < 0.9 < after["eval/reward/format/mean"]
    assert after["eval/accuracy"] > before["eval/accuracy"] + 0.15
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    assert mean(train[-5:], "reward/mean") > mean(train[:5], "reward/mean") + 0.1
