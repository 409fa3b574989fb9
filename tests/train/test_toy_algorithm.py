"""A new RL method is one `Algorithm` record: this file alone defines one and trains two steps with it.

The toy method ("sign advantages") gives each sample +1 / -1 by whether its reward beats its group's mean
(0 for ties) and reports the share of positive samples. Its record is `TOY_SIGN` in this file, selected by
`algorithm.name: path/to/test_toy_algorithm.py:TOY_SIGN` and trained through the real `jaxrl train` in a
subprocess: one file, no edit of the library, nothing in the library names it (issue 26 item 4).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _common import BASE, ROOT, env, metrics


def toy_sign_advantages(rewards_BR, weights_R, mask_BT, s):
    from jaxrl.algorithms import combined_reward, sequence_advantages

    r_PG = np.nan_to_num(combined_reward(rewards_BR, weights_R)).reshape(-1, s.group_size)
    adv_B = np.sign(r_PG - r_PG.mean(axis=1, keepdims=True)).reshape(-1)
    return sequence_advantages(adv_B, mask_BT, s, {"toy/positive_frac": float(np.mean(adv_B > 0))})


from jaxrl.algorithms import Algorithm  # noqa: E402 -- after the function the record holds

TOY_SIGN = Algorithm("toy_sign", toy_sign_advantages)  # `algorithm.name: <this file>:TOY_SIGN`


def _train(run_dir, name: str) -> subprocess.CompletedProcess:
    args = [a for o in (*BASE, f"algorithm.name={name}") for a in ("--set", o)]
    return subprocess.run([sys.executable, "-m", "jaxrl.cli", "train", *args, "--run-dir", str(run_dir)],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)


def test_a_toy_algorithm_defined_here_trains_two_steps(tmp_path):
    """Named by reference (`path/file.py:ATTR`; `package.module:ATTR` alike) through the real CLI: the
    library registers the record at config load (`jaxrl.algorithms.resolve`)."""
    proc = _train(tmp_path / "run", f"{Path(__file__).resolve()}:TOY_SIGN")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the record's advantage function ran: its metric is logged, and it is a fraction
        assert 0.0 <= r["toy/positive_frac"] <= 1.0
        assert r["train/grad_norm"] > 0 and np.isfinite(r["loss"])


def test_unknown_names_and_non_records_are_refused_at_load(tmp_path):
    from jaxrl.config import load_config
    from jaxrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"algorithm.name='toy_sign': allowed values are 'grpo'"):
        load_config(None, ["algorithm.name=toy_sign"])  # an unregistered name, naming the registry's entries
    not_a_record = "test_toy_algorithm:toy_sign_advantages"  # a function, not a record
    with pytest.raises(ConfigError, match=rf"algorithm.name='{not_a_record}': module 'test_toy_algorithm' has "
                                          r"no Algorithm record 'toy_sign_advantages'"):
        load_config(None, [f"algorithm.name={not_a_record}"])
    with pytest.raises(ConfigError, match=r"algorithm.name='no_such_algo_mod:X': cannot import module"):
        load_config(None, ["algorithm.name=no_such_algo_mod:X"])
