"""The embedded default (configs/quickstart.yaml), shortened: RL after the SFT warm start raises the reward.

Runs `jaxrl train` with no config file (the embedded default) in a subprocess on one CPU device, with fewer SFT
steps (the format is then only partly learned, so RL has something to fix) and fewer RL steps. Fixed seeds make
the run deterministic; the assertion is on the learning effect (mean reward of the last steps above the first
steps, and the format reward rising), not on exact values.
"""

import subprocess
import sys

import pytest

from _common import ROOT, env, metrics

SHORT = ("sft_warmup.steps=60", "train.steps=24", "train.eval_every=0", "logging.progress_bar=false",
         "logging.tensorboard=false", "checkpoint.every=1000", "checkpoint.async_save=false")


@pytest.mark.slow  # ~2-3 minutes on 2 cores (SFT warm start + 24 RL steps of the 4-layer model)
def test_quickstart_reward_rises(tmp_path):
    run_dir = tmp_path / "qs"
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", *[a for o in SHORT for a in ("--set", o)],
           "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert [r["step"] for r in rows] == list(range(1, 25))
    first, last = rows[:6], rows[-6:]
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    assert mean(last, "reward/mean") > mean(first, "reward/mean") + 0.05
    assert mean(last, "reward/format/mean") > mean(first, "reward/format/mean")
