"""`rollout.engine` through the real CLI (issue 33 item 1): the continuous engine trains exactly as the static one.

Two tiny 2-step GRPO runs side by side on 4 fake devices, completions of up to 24 tokens stopping at EOS at mixed
lengths: with 8 decode slots for the 16 rows of a step, refilled as rows stop, every metric of every step is
the same as with the static batch, bit for bit (rollouts, rewards, loss, gradient norm, held-out accuracy),
while the decode loop runs more steps of fewer rows (`rollout/decode_steps`, `rollout/slot_use`). (With 4
slots, one per device, the sampler's log-probs differed from the static batch's in the last bit: a device's
one-row decode step rounds unlike its several-row one; so one slot per device is refused, below.)
The multi-host form (2 processes x 2 devices = 1 x 4) is the ppo case of tests/sharding/test_multihost_cli.py.
Also: the engine's configuration errors (one line, before anything is built).
"""

from __future__ import annotations

import subprocess
import sys

import jax
import pytest

from jaxrl.config import load_config
from jaxrl.errors import ConfigError
from jaxrl.rl import placement
from jaxrl.sharding import MeshConfig, make_mesh
from tests.sharding.test_multihost_cli import BASE, _env, assert_same_metrics, metrics

# held-out: 2 sampled completions per prompt too, in batches of 4 and 2 prompts (the last one's 4 rows are
# fewer than the 8 slots: evaluation decodes with the static engine)
RUN = ["train.steps=2", "train.eval_every=2", "algorithm.name=grpo", "data.prompts_per_step=4",
       "rollout.group_size=4", "rollout.max_new_tokens=24", "rollout.gen_buckets=[32]", "data.eval_size=6",
       "train.eval_samples=2"]
COMPARED = ("loss", "reward/mean", "eval/accuracy", "eval/pass@2", "train/grad_norm", "response_length/mean",
            "response/finished_frac", "entropy")


@pytest.mark.slow  # two tiny CLI runs side by side, about 20 s
def test_continuous_engine_trains_exactly_as_the_static_batch(tmp_path):
    procs = {}
    for name, extra in (("static", []), ("continuous", ["rollout.engine.kind=continuous",
                                                        "rollout.engine.slots=8"])):
        argv = [sys.executable, "-m", "jaxrl.cli", "train", "--run-dir", str(tmp_path / name)]
        argv += [a for o in BASE + RUN + extra for a in ("--set", o)]
        procs[name] = subprocess.Popen(argv, env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
    logs = {n: p.communicate(timeout=600)[0] for n, p in procs.items()}
    for n, p in procs.items():
        assert p.returncode == 0, logs[n][-3000:]
    static, cont = metrics(tmp_path / "static"), metrics(tmp_path / "continuous")
    assert_same_metrics(cont, static, keys=COMPARED)  # the same keys at every step, and then bit for bit:
    assert [[r.get(k) for k in COMPARED] for r in cont] == [[r.get(k) for k in COMPARED] for r in static]
    assert any("eval/pass@2" in r for r in static)
    steps = [r for r in static if "loss" in r]
    assert any(0 < r["response/finished_frac"] < 1 for r in steps), steps  # EOS at mixed lengths
    for s, c in zip(steps, (r for r in cont if "loss" in r)):
        assert s["rollout/decode_steps"] == s["response_length/max"]  # the static batch waits for its longest row
        assert c["rollout/decode_steps"] > s["rollout/decode_steps"]  # 8 rows at a time, not 16
        tokens = s["response_length/mean"] * 16
        assert c["rollout/slot_use"] == tokens / (8 * c["rollout/decode_steps"])  # 8 slots busy that share


@pytest.mark.parametrize("config,sets,match", [
    (None, ["rollout.engine.kind=paged"], "rollout.engine.kind='paged': allowed values are 'static', 'continuous'"),
    (None, ["rollout.engine.slots=4"], "rollout.engine.slots=4: is the continuous engine's"),
    (None, ["rollout.engine.kind=continuous", "rollout.engine.slots=1"], "rollout.engine.slots=1: must be >= 2"),
    (None, ["rollout.engine.kind=continuous", "rollout.engine.slots=65"],
     r"rollout.engine.slots=65: must be <= the rows of a step \(data.prompts_per_step x rollout.group_size = 64\)"),
    ("configs/ssp_tiny.yaml", ["rollout.engine.kind=continuous"],
     "rollout.engine.kind='continuous': must be 'static' with multi_agent:"),
])
def test_bad_engine_config_is_one_line(config, sets, match):
    with pytest.raises(ConfigError, match=match):
        load_config(config, sets)


def test_slots_split_over_the_sampler_batch_shards():
    mesh = make_mesh(MeshConfig(data=2, fsdp=2), jax.devices()[:4])
    placement.check_slots(8, mesh)
    placement.check_slots(None, mesh)
    with pytest.raises(ConfigError, match=r"rollout.engine.slots=6: must be a multiple of the sampler's 4 batch"):
        placement.check_slots(6, mesh)
    with pytest.raises(ConfigError, match=r"rollout.engine.slots=4: .* at least 2 per shard \(>= 8"):
        placement.check_slots(4, mesh)  # one slot per device
