"""Asynchronous RL with bounded staleness (`train.async.max_staleness: k`, `jaxrl.rl.ahead`; issue 27).

Unit, with a fake collector that reports which parameter version sampled each step: for k = 1, 2, 3 the
rollout of step s is sampled by version max(s − 1 − k, 0), so its staleness never exceeds k; the next step's
collection is launched before the update (in a background thread where it may overlap) and the sampler keeps
at most k + 1 versions; a checkpoint written mid-run restores the sampler's versions and re-collects the
rollout that was launched, so the resumed steps see exactly what the uninterrupted ones saw.

CLI (one CPU device, overlap on): k = 1 trains 4 steps with `async/staleness_max` = min(step − 1, 1), its step 1
equals the synchronous run's (both sample version 0) and its step 2 does not (the synchronous run takes those 2
steps only); the run's directory as it was after its step-2 checkpoint (step 3's rollout launched, not yet
trained) resumes to the uninterrupted run's metrics exactly. k < 0 is refused at load.
"""

import functools
import json
import shutil
import threading

import jax.numpy as jnp
import pytest

from _common import trained_metrics

from jaxrl.io.checkpoint import Restored
from jaxrl.config import load_config
from jaxrl.errors import ConfigError
from jaxrl.rl.ahead import Ahead, Synchronous
from jaxrl.rl.partial import make_feed
from jaxrl.runtime.step_time import StageClock
from jaxrl.learner.train_step import TrainState


class _Policy:
    @staticmethod
    def sampling_params(trained):
        return trained


class _Collector:
    """Collects 'rollouts' that record the parameter version that sampled them, and in which thread."""

    name = "fake"

    def __init__(self):
        self.calls = 0

    def state_json(self):
        return {"calls": self.calls}

    def load_state(self, data):
        self.calls = data["calls"]


class _Run:
    def __init__(self):
        self.policy, self.collector = _Policy(), _Collector()


def _collect(run, params, records, step, clock):
    run.collector.calls += 1
    return {"version": int(params), "records": records, "step": step,
            "thread": threading.current_thread().name}


def _loop(feed, run, first: int, stop: int, last: int, params: int, draws: list[int]):
    """The training loop's calls (`jaxrl.rl.loop`, `jaxrl.rl.step`) for steps first..stop of a run of `last`
    steps; an update adds 1 to the parameters; `draws` is the data iterator (the batches drawn so far).
    Returns ({step: rollout and async metrics}, the most sampler versions held at once, the state)."""
    taken, most = {}, 0

    def draw():
        draws.append(draws[-1] + 1 if draws else 0)
        return [draws[-1]]

    collect = functools.partial(_collect, run)
    state = TrainState(jnp.asarray(params, jnp.int32), None, None)
    for step in range(first, stop + 1):
        records = feed.records_for(step, draw)
        got = feed.take(run, state, records, step, collect, StageClock())
        assert got.rollout["records"] == records and got.rollout["step"] == step
        taken[step] = {**got.rollout, **got.metrics}
        feed.launch(run, step + 1, draw if step < last else None, collect)
        most = max(most, len(getattr(feed, "_versions", {})))
        state = TrainState(state.params + 1, None, None)  # the update of this step
    return taken, most, state


@pytest.mark.parametrize("k", [1, 2, 3])
def test_every_rollout_is_sampled_at_most_k_versions_behind(k):
    feed = Ahead(k, overlap=True)
    taken, most, _ = _loop(feed, _Run(), 1, 9, 9, 0, [])
    feed.close()
    for step, ro in taken.items():
        assert ro["version"] == max(step - 1 - k, 0)
        assert ro["async/staleness_max"] == min(step - 1, k) <= k
        assert ro["async/behaviour_version"] == ro["version"]
    assert [ro["records"] for ro in taken.values()] == [[i] for i in range(9)]  # each batch once, in order
    assert all(ro["thread"].startswith("jaxrl-ahead") for s, ro in taken.items() if s > 1)  # launched ahead
    assert most <= k + 1


def test_synchronous_samples_the_current_policy_and_is_the_default():
    assert isinstance(make_feed(0, processes=1, devices=1), Synchronous)
    assert make_feed(1, processes=1, devices=1).overlap
    assert not make_feed(1, processes=2, devices=2).overlap and not make_feed(1, processes=1, devices=4).overlap
    assert make_feed(1, processes=1, devices=4, own_sampler_devices=True).overlap  # mesh.rollout_devices
    assert not make_feed(1, processes=2, devices=4, own_sampler_devices=True).overlap
    taken, _, _ = _loop(Synchronous(), _Run(), 1, 4, 4, 0, [])
    assert [ro["version"] for ro in taken.values()] == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="train.async.max_staleness=-1: must be >= 0"):
        load_config(None, ["train.async.max_staleness=-1"])
    assert load_config(None, ["train.async.max_staleness=2"]).train.async_.max_staleness == 2


class _Checkpointer:
    def __init__(self, behind):
        self.behind = behind

    def restore_behind(self, step, params_like, names):
        return {name: self.behind[name] for name in names}


@pytest.mark.parametrize("k", [1, 2])
def test_a_checkpoint_resumes_the_launched_rollout_and_the_sampler_versions(k):
    whole, _, _ = _loop(Ahead(k, overlap=False), _Run(), 1, 8, 8, 0, [])
    feed, run, draws = Ahead(k, overlap=False), _Run(), []
    _, _, state = _loop(feed, run, 1, 4, 8, 0, draws)  # stopped after step 4, step 5's rollout launched
    behind, extra = feed.checkpoint(4)
    extra = json.loads(json.dumps({**extra, "stages": {"fake": feed.collector_state(run.collector)}}))
    assert set(extra["async"]["pending"]) == {"5"} and extra["async"]["versions"] == list(range(4 - k, 4))
    assert sorted(behind) == [f"v{v}" for v in range(4 - k, 4)]
    resumed, run2 = Ahead(k, overlap=False), _Run()
    run2.collector.load_state(extra["stages"]["fake"])  # the state before step 5's collection
    resumed.restore(_Checkpointer(behind), Restored(4, state.params, None, extra), state.params)
    rest, _, _ = _loop(resumed, run2, 5, 8, 8, int(state.params), list(draws))
    for step in range(5, 9):
        assert {key: rest[step][key] for key in ("version", "records", "async/staleness_max")} == \
            {key: whole[step][key] for key in ("version", "records", "async/staleness_max")}, step
    assert run2.collector.calls == 8  # the launched collection ran again, from the state before it


ASYNC = ("algorithm.name=grpo", "train.steps=4", "checkpoint.every=2", "train.async.max_staleness=1")


@pytest.mark.slow
def test_cli_k1_trains_stale_by_one_and_resumes_exactly(tmp_path):
    train = trained_metrics
    stale = train(tmp_path / "k1", *ASYNC)
    # the synchronous run: its first 2 steps are all the comparison reads (and its final checkpoint only)
    sync = train(tmp_path / "k0", *ASYNC[:-1], "train.steps=2", "checkpoint.every=100")
    assert [r["step"] for r in sync] == [1, 2]
    assert [r["async/staleness_max"] for r in stale] == [0.0, 1.0, 1.0, 1.0]
    assert [r["async/behaviour_version"] for r in stale] == [0.0, 0.0, 1.0, 2.0]
    assert all("async/staleness_max" not in r for r in sync)
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("async/")}  # noqa: E731
    assert strip(stale[0]) == sync[0]  # both sample version 0 at step 1
    assert stale[1]["loss"] != sync[1]["loss"]  # step 2: version 0 against version 1
    # the run as it was after its step-2 checkpoint: step 3's rollout launched, not trained
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "k1", cut)
    assert sorted(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit()) == [2, 4]
    shutil.rmtree(cut / "checkpoints" / "4")
    rows = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("".join(line + "\n" for line in rows if json.loads(line)["step"] <= 2))
    assert train(cut, *ASYNC) == stale


def test_a_launched_rollouts_records_are_trained_first_by_any_feed_that_resumes():
    """The data iterator is saved past the records of a rollout launched ahead; a resume with another k (0
    included) must train on them before drawing new ones, not skip that batch."""
    feed, run, draws = Ahead(1, overlap=False), _Run(), []
    _, _, state = _loop(feed, run, 1, 2, 4, 0, draws)  # step 3's rollout launched
    _, extra = feed.checkpoint(2)
    restored = Restored(2, state.params, None, json.loads(json.dumps(extra)))
    fresh = lambda: ["drawn"]  # noqa: E731
    for other in (Synchronous(), Ahead(2, overlap=False)):
        other.restore(_Checkpointer({}), restored, state.params)
        assert other.records_for(3, fresh) == [draws[-1]] and other.records_for(4, fresh) == ["drawn"]
