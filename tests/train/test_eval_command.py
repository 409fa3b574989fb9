"""`jaxrl eval` scores a trained run's checkpoint with greedy accuracy, avg@k and unbiased pass@k.

Invariants checked (they hold for any model): with binary correctness, the unbiased pass@1 equals avg@k
exactly; pass@j never decreases in j; every value is a probability; the eval command uses the run's own
config (rewards, prompt format) and its held-out split.
"""

from __future__ import annotations

import json
import subprocess
import sys

from _common import ROOT, env, run_train

from jaxrl import cli


def test_eval_reports_avg_and_pass_at_k(tmp_path, capsys):
    run = tmp_path / "run"
    proc = run_train(run, "data.eval_size=6", "train.steps=1")  # one trained step: a checkpoint to score
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "jaxrl.cli", "eval", "--checkpoint", str(run), "--k", "4", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r == json.loads(res.stdout)
    assert r["num_prompts"] == 6 and r["k"] == 4
    assert set(r) >= {"eval/accuracy", "eval/reward/digits/mean", "eval/avg@4", "eval/pass@1", "eval/pass@2",
                      "eval/pass@4"}
    assert abs(r["eval/pass@1"] - r["eval/avg@4"]) < 1e-12
    assert r["eval/pass@1"] <= r["eval/pass@2"] <= r["eval/pass@4"] <= 1.0
    assert r["eval/pass@4"] > 0  # the digits reward is positive for some random completions
    # refused before any model work: `jaxrl.cli.main` in this process (its return value is the exit status)
    assert cli.main(["eval", "--checkpoint", str(run), "--k", "0"]) == 2
    assert "--k=0: must be >= 1" in capsys.readouterr().err


def test_a_per_role_adapter_run_is_refused_in_one_line():
    """`jaxrl eval` plays one policy; a run with one adapter set per role is refused before any model work."""
    import pytest

    from jaxrl.config import load_config
    from jaxrl.errors import UserError
    from jaxrl.rl.setup import eval_collector

    cfg = load_config(ROOT / "configs" / "march_tiny.yaml", ["model.lora={rank: 4, alpha: 8}",
                                                             "multi_agent.adapters=per_role"])
    with pytest.raises(UserError, match=r"^multi_agent.adapters='per_role': jaxrl eval runs one policy"):
        eval_collector(cfg, None, None, None)
