"""A new RL method is one `Algorithm` record: this file alone defines one and trains two steps with it.

The toy method ("sign advantages") gives each sample +1 / -1 by whether its reward beats its group's mean
(0 for ties) and reports the share of positive samples. It is registered from this file, selected by
`algorithm.name: toy_sign`, and trained through the real `jaxrl train` code path in a subprocess; nothing in
the library names it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from _common import BASE, ROOT, env, metrics


def toy_sign_advantages(rewards_NK, weights_K, mask_NT, s):
    from jaxrl.algorithms import combined_reward, sequence_advantages

    r_PG = np.nan_to_num(combined_reward(rewards_NK, weights_K)).reshape(-1, s.group_size)
    adv_N = np.sign(r_PG - r_PG.mean(axis=1, keepdims=True)).reshape(-1)
    return sequence_advantages(adv_N, mask_NT, s, {"toy/positive_frac": float(np.mean(adv_N > 0))})


def _main(run_dir: str, *overrides: str) -> None:
    """Registers the toy record, then runs the CLI's train path in this process."""
    from jaxrl.algorithms import ALGORITHMS, Algorithm
    from jaxrl.cli import main

    ALGORITHMS["toy_sign"] = Algorithm("toy_sign", toy_sign_advantages)
    args = [a for o in (*BASE, "algorithm.name=toy_sign", *overrides) for a in ("--set", o)]
    sys.argv = ["jaxrl", "train", *args, "--run-dir", run_dir]
    raise SystemExit(main())


def test_a_toy_algorithm_defined_here_trains_two_steps(tmp_path):
    proc = subprocess.run([sys.executable, __file__, str(tmp_path / "run")], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the record's advantage function ran: its metric is logged, and it is a fraction
        assert 0.0 <= r["toy/positive_frac"] <= 1.0
        assert r["train/grad_norm"] > 0 and np.isfinite(r["loss"])
    # an unregistered name is refused at load, naming the registry's entries
    bad = subprocess.run([sys.executable, "-m", "jaxrl.cli", "train", "--set", "algorithm.name=toy_sign",
                          "--run-dir", str(tmp_path / "bad")], cwd=ROOT, env=env(), capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "algorithm.name='toy_sign': allowed values are 'grpo'" in bad.stderr


if __name__ == "__main__":
    _main(*sys.argv[1:])
