"""A new RL method is one `Algorithm` record: this file alone defines one, with a hyper-parameter of its own,
and trains two steps with it.

The toy method ("sign advantages") gives each sample +1 / -1 by whether its reward beats its group's mean by
more than `margin` (0 for ties) and reports the share of positive samples. Its record is `TOY_SIGN` in this
file, with its parameter class `ToyParams`, selected by `algorithm.name: path/to/test_toy_algorithm.py:TOY_SIGN`
and `algorithm.params: {margin: ...}`, and trained through the real `jaxrl train` in a subprocess: one file, no
edit of the library, nothing in the library names it (issue 26 item 4).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _common import BASE, ROOT, env, metrics


@dataclasses.dataclass(frozen=True)
class ToyParams:
    """`algorithm.params` of the toy method."""

    margin: float = 0.0  # a sample is positive when its reward beats its group's mean by more than this

    def __post_init__(self):
        if not self.margin < 1e3:
            raise ValueError(f"margin must be < 1000, got {self.margin}")


def toy_sign_advantages(rewards_BR, weights_R, mask_BT, s):
    from jaxrl.algorithms import combined_reward, sequence_advantages

    r_PG = np.nan_to_num(combined_reward(rewards_BR, weights_R)).reshape(-1, s.group_size)
    adv_B = np.sign(r_PG - r_PG.mean(axis=1, keepdims=True) - s.params.margin).reshape(-1)
    return sequence_advantages(adv_B, mask_BT, s, {"toy/positive_frac": float(np.mean(adv_B > 0))})


from jaxrl.algorithms import Algorithm  # noqa: E402 -- after the function the record holds

# `algorithm.name: <this file>:TOY_SIGN`, its hyper-parameters under `algorithm.params`
TOY_SIGN = Algorithm("toy_sign", toy_sign_advantages, params=ToyParams)


@dataclasses.dataclass(frozen=True)
class ScaleParams:
    """`algorithm.objective.params` of the toy objective."""

    scale: float = 1.0


def scaled_clip(logp_BT, batch, m_BT, spec, *, scale):
    """A policy objective of one's own: PPO's clipped objective times `scale`."""
    from jaxrl import losses

    loss_BT, metrics = losses.clipped_objective(logp_BT, batch.old_logp_BT, batch.adv_BT, m_BT,
                                                clip_low=batch.clip_low_B, clip_high=batch.clip_high_B)
    return scale * loss_BT, metrics


from jaxrl.learner.objectives import PolicyObjective  # noqa: E402

# `algorithm.objective.name: <this file>:TOY_SCALED`, its hyper-parameter under `algorithm.objective.params`
# (tests/train/test_objectives_wiring.py shows the scale reaching the step's loss)
TOY_SCALED = PolicyObjective("toy_scaled", scaled_clip, params=ScaleParams)


def _train(run_dir, name: str, *overrides: str) -> subprocess.CompletedProcess:
    args = [a for o in (*BASE, f"algorithm.name={name}", *overrides) for a in ("--set", o)]
    return subprocess.run([sys.executable, "-m", "jaxrl.cli", "train", *args, "--run-dir", str(run_dir)],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)


def test_a_toy_algorithm_defined_here_trains_two_steps(tmp_path):
    """Named by reference (`path/file.py:ATTR`; `package.module:ATTR` alike) through the real CLI: the
    library registers the record at config load (`jaxrl.algorithms.resolve`), and its hyper-parameter reaches
    the advantage function: with margin -10 every sample beats its group's mean by more than the margin
    (rewards are in [0, 1]), so the positive share is exactly 1, which no margin >= 0 can give (a group's
    samples cannot all exceed their own mean). The run's policy objective is this file's too."""
    here = Path(__file__).resolve()
    proc = _train(tmp_path / "run", f"{here}:TOY_SIGN", "algorithm.params.margin=-10",
                  f"algorithm.objective.name={here}:TOY_SCALED", "algorithm.objective.params.scale=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["toy/positive_frac"] == 1.0  # the record's function ran with the config's margin
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


def test_algorithm_params_are_checked_against_the_records_class_at_load():
    """`algorithm.params` goes through the record's parameter class: an unknown key (with the nearest valid
    one), a wrong type and the class's own check fail at load with one line naming the key; a record that
    declares no parameters refuses any."""
    from jaxrl.config import load_config
    from jaxrl.errors import ConfigError

    toy = f"{Path(__file__).resolve()}:TOY_SIGN"
    assert load_config(None, [f"algorithm.name={toy}", "algorithm.params.margin=0.5"]).algorithm.params == {
        "margin": 0.5}
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.params.margn'; did you mean "
                                          r"'algorithm.params.margin'\? \(valid keys of algorithm.params: margin\)"):
        load_config(None, [f"algorithm.name={toy}", "algorithm.params.margn=0.5"])
    with pytest.raises(ConfigError, match=r"algorithm.params.margin='wide': expected float, got str"):
        load_config(None, [f"algorithm.name={toy}", "algorithm.params.margin=wide"])
    with pytest.raises(ConfigError, match=r"algorithm.params of 'toy_sign': margin must be < 1000, got 5000.0"):
        load_config(None, [f"algorithm.name={toy}", "algorithm.params.margin=5000"])
    with pytest.raises(ConfigError, match=r"algorithm.params=\{'margin': 1\}: 'grpo' declares no "
                                          r"parameters"):
        load_config(None, ["algorithm.name=grpo", "algorithm.params.margin=1"])
    with pytest.raises(ConfigError, match=r"algorithm.objective.params.scale='x': expected float, got str"):
        load_config(None, [f"algorithm.objective.name={Path(__file__).resolve()}:TOY_SCALED",
                           "algorithm.objective.params.scale=x"])
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.objective.params.w_max' \(valid keys of "
                                          r"algorithm.objective.params: clip_low, clip_high\)"):
        load_config(None, ["algorithm.objective.name=gspo", "algorithm.objective.params.w_max=2"])  # cispo's
    with pytest.raises(ConfigError, match=r"'algorithm.objective.gspo_low' has moved: write "
                                          r"'algorithm.objective.params.clip_low' instead"):
        load_config(None, ["algorithm.objective.gspo_low=0.1"])
