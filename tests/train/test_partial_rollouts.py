"""Partial rollouts (`train.async.partial_rollouts: true`, `jaxrl.rl.partial`; issue 27 item 3).

Collector (tiny model, in process): under one set of weights, a first segment of ⌈T/2⌉ tokens continued by
re-prefill gives the whole rows: greedy, the same tokens, lengths, texts and rewards as one uninterrupted
decode, and log-probs equal to float rounding (the continued tokens' come from a prefill, not the KV-cached
decode step); sampled, the first segment's tokens and log-probs are the whole rows' first tokens exactly (same
key; the second segment draws from another key stream, so only greedy decoding can match beyond the split).
So with equal versions (learning rate 0) and greedy sampling a partial-rollouts run trains on the tokens of the
unsegmented k = 1 run.

Feed (fake collector): each token records the version that sampled it, b(s) before the split (or for a row
that ended there) and s − 1 after; the token staleness metrics follow and never exceed k; a checkpoint
resumes the launched first segment with its saved version and continues it under the restored weights.

CLI (one CPU device): k = 1 with partial rollouts trains, reports token staleness <= 1, and the run's directory
as it was after its step-2 checkpoint resumes to the uninterrupted run's metrics exactly. Config refusals
(k = 0, env, multi_agent, DAPO's resampling) are one line.
"""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _common import trained_metrics

from jaxrl.config import load_config
from jaxrl.errors import ConfigError
from jaxrl.io.checkpoint import Restored
from jaxrl.learner.train_step import TrainState
from jaxrl.rl.partial import Partial, make_feed, split_point, token_staleness, versions_BT
from jaxrl.runtime.step_time import StageClock
from jaxrl.sampling import SamplingSpec


@pytest.fixture(scope="module")
def single_turn():
    from flax import nnx

    from jaxrl import rewards as rewards_lib
    from jaxrl.config import RewardSpec
    from jaxrl.io.tokenizer import builtin_tokenizer
    from jaxrl.models import Transformer, TransformerConfig
    from jaxrl.rl.collect import SingleTurn

    tok = builtin_tokenizer()
    model = Transformer(TransformerConfig.tiny(vocab_size=len(tok), max_position_embeddings=64), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rewards = rewards_lib.resolve([RewardSpec(name="len", type="length", params={"target": 3})])
    records = [{"prompt": p, "prompt_ids": tok.encode(p)} for p in ("ab", "cde", "f")]
    return SingleTurn(graphdef, tok, rewards), state, records


def _segmented(collector, state, records, spec, key):
    split = split_point(spec.max_new_tokens)
    first = collector.first_segment(state, records, spec, key, split)
    return first, collector.continuation(first, split)(state, records, spec, key, train=True)


class _Eos:
    """The tokenizer with another EOS token (the untrained model never samples its own)."""

    def __init__(self, tok, eos: int):
        self.tok, self.eos_token_id = tok, eos

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_under_one_version_the_segments_are_the_whole_rows(single_turn):
    from jaxrl.rl.collect import SingleTurn

    collector, state, records = single_turn
    key = jax.random.key(3)
    greedy = SamplingSpec(max_new_tokens=9, num_samples=2, temperature=0.0, prompt_buckets=(16,))
    plain = collector(state, records, greedy, key, train=True)
    # a token of row 0's first segment as EOS: some rows end in the first segment, the others continue
    eos = int(np.asarray(plain.tokens_BL)[0, 16 + 2])
    collector = SingleTurn(collector.graphdef, _Eos(collector.tokenizer, eos), collector.rewards)
    whole = collector(state, records, greedy, key, train=True)
    first, ro = _segmented(collector, state, records, greedy, key)
    assert split_point(9) == 5 and first.finished_B.any() and (first.lengths_B == 5).any(), first.lengths_B
    np.testing.assert_array_equal(np.asarray(ro.tokens_BL), np.asarray(whole.tokens_BL))
    np.testing.assert_array_equal(ro.mask_BL, whole.mask_BL)
    np.testing.assert_array_equal(ro.lengths_B, whole.lengths_B)
    np.testing.assert_array_equal(ro.finished_B, whole.finished_B)
    assert ro.completions == whole.completions
    np.testing.assert_array_equal(ro.rewards_BR, whole.rewards_BR)
    np.testing.assert_allclose(np.asarray(ro.old_logp_BT), np.asarray(whole.old_logp_BT), atol=1e-5)
    # sampled: the first segment is the whole rows' first tokens, bit for bit (the same key)
    sampled = dataclasses.replace(greedy, temperature=1.0)
    whole = collector(state, records, sampled, key, train=True)
    first, ro = _segmented(collector, state, records, sampled, key)
    np.testing.assert_array_equal(np.asarray(first.gen.tokens)[:, :5], np.asarray(whole.tokens_BL)[:, 16:21])
    np.testing.assert_array_equal(np.asarray(first.gen.logprobs)[:, :5], np.asarray(whole.old_logp_BT)[:, :5])
    np.testing.assert_array_equal(np.asarray(ro.tokens_BL)[:, :21], np.asarray(whole.tokens_BL)[:, :21])


# --- the feed, with a fake collector -------------------------------------------------------------------------


class _Policy:
    @staticmethod
    def sampling_params(trained):
        return trained


@dataclasses.dataclass
class _First:
    version: int
    lengths_B: np.ndarray
    finished_B: np.ndarray


class _Collector:
    """First segments of 4 rows (row 0 ends at 2 tokens with an EOS, the others reach the split); the
    continuation records the version it was given."""

    name = "fake"

    def __init__(self):
        self.calls = 0

    def first_segment(self, params, records, spec, key, split):
        self.calls += 1
        return _First(int(params), np.array([2, split, split, split]), np.array([True, False, False, False]))

    def continuation(self, first, split):
        def finish(params, records, spec, key, *, train):
            lengths_B = np.where(first.finished_B, first.lengths_B, spec.max_new_tokens - 1)
            cmask_BT = np.arange(spec.max_new_tokens)[None, :] < lengths_B[:, None]
            return _Rollout(cmask_BT, {"first": first.version, "rest": int(params), "records": records})
        return finish

    def state_json(self):
        return {"calls": self.calls}

    def load_state(self, data):
        self.calls = data["calls"]


@dataclasses.dataclass
class _Rollout:
    completion_mask_BT: np.ndarray
    info: dict
    version_BT: np.ndarray | None = None


class _Run:
    seed = 0
    sampling = SamplingSpec(max_new_tokens=8)

    def __init__(self):
        self.policy, self.collector = _Policy(), _Collector()


def _collect(run, params, records, step, clock, collector=None):
    return (collector or run.collector)(params, records, run.sampling, None, train=True)


def _loop(feed, run, first, stop, last, params, draws):
    taken = {}

    def draw():
        draws.append(draws[-1] + 1 if draws else 0)
        return [draws[-1]]

    collect = lambda *a, **kw: _collect(run, *a, **kw)  # noqa: E731
    state = TrainState(jnp.asarray(params, jnp.int32), None, None)
    for step in range(first, stop + 1):
        records = feed.records_for(step, draw)
        got = feed.take(run, state, records, step, collect, StageClock())
        taken[step] = (got.rollout, got.metrics)
        feed.launch(run, step + 1, draw if step < last else None, collect)
        state = TrainState(state.params + 1, None, None)
    return taken, state


@pytest.mark.parametrize("k", [1, 2])
def test_each_token_records_the_version_that_sampled_it(k):
    assert isinstance(make_feed(k, processes=1, devices=1, partial=True), Partial)
    feed = Partial(k, overlap=True)
    taken, _ = _loop(feed, _Run(), 1, 6, 6, 0, [])
    feed.close()
    for step, (ro, m) in taken.items():
        b = max(step - 1 - k, 0)
        assert ro.info == {"first": b, "rest": step - 1, "records": ro.info["records"]}
        expect = np.full((4, 8), step - 1)
        expect[:, :4] = b  # the split: ⌈8 / 2⌉ tokens sampled by b(s)
        expect[0, :] = b  # row 0 ended in the first segment (its tokens past 2 are masked out)
        np.testing.assert_array_equal(ro.version_BT[:, :7], expect[:, :7])
        stale = (step - 1) - ro.version_BT[ro.completion_mask_BT]
        assert m["async/token_staleness_max"] == stale.max() == m["async/staleness_max"] == min(step - 1, k) <= k
        assert m["async/token_staleness_mean"] == pytest.approx(stale.mean())
        assert m["async/continued_frac"] == 0.75
    assert token_staleness(versions_BT(np.array([1, 3]), 4, 2, 5), np.ones((2, 4), bool), 5) == {
        "async/token_staleness_mean": 1.5, "async/token_staleness_max": 3.0}


class _Checkpointer:
    def __init__(self, behind):
        self.behind = behind

    def restore_behind(self, step, params_like, names):
        return {name: self.behind[name] for name in names}


def test_a_checkpoint_resumes_both_segments():
    k = 2
    whole, _ = _loop(Partial(k, overlap=False), _Run(), 1, 7, 7, 0, [])
    feed, run, draws = Partial(k, overlap=False), _Run(), []
    _, state = _loop(feed, run, 1, 4, 7, 0, draws)  # stopped after step 4, step 5's first segment launched
    behind, extra = feed.checkpoint(4)
    extra = json.loads(json.dumps({**extra, "stages": {"fake": feed.collector_state(run.collector)}}))
    assert extra["async"]["pending"] == {"5": {"records": [4], "version": 2}}
    resumed, run2 = Partial(k, overlap=False), _Run()
    run2.collector.load_state(extra["stages"]["fake"])
    resumed.restore(_Checkpointer(behind), Restored(4, state.params, None, extra), state.params)
    rest, _ = _loop(resumed, run2, 5, 7, 7, int(state.params), list(draws))
    for step in range(5, 8):
        assert rest[step][0].info == whole[step][0].info, step
        np.testing.assert_array_equal(rest[step][0].version_BT, whole[step][0].version_BT)
        assert rest[step][1] | {"time/exposed_generation": 0} == whole[step][1] | {"time/exposed_generation": 0}
    assert run2.collector.calls == 7  # step 5's first segment ran again


def test_config_refusals_are_one_line():
    refusals = {
        ("train.async.partial_rollouts=true",): "needs train.async.max_staleness >= 1",
        ("train.async.max_staleness=1", "train.async.partial_rollouts=true", "algorithm.name=dapo"):
            "algorithm.name='dapo' resamples groups during the step (DAPO dynamic sampling), which needs whole "
            "groups sampled by one policy version",
        ("train.async.max_staleness=1", "train.async.partial_rollouts=true", "env={name: calculator}"):
            "continues single-turn completions only; remove the env section",
        ("train.async.max_staleness=1", "train.async.partial_rollouts=true", "multi_agent={system: debate}"):
            "remove the multi_agent section",
    }
    for overrides, message in refusals.items():
        with pytest.raises(ConfigError) as err:
            load_config(None, list(overrides))
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert str(err.value).startswith("train.async.partial_rollouts=True: "), str(err.value)
    cfg = load_config(None, ["train.async.max_staleness=1", "train.async.partial_rollouts=true"])
    assert cfg.train.async_.partial_rollouts


def test_the_cli_refuses_dapo_with_one_line_exit_2_before_compiling(tmp_path, capsys):
    from jaxrl.cli import main

    sets = ["train.async.max_staleness=1", "train.async.partial_rollouts=true", "algorithm.name=dapo"]
    assert main(["train", "--run-dir", str(tmp_path / "run")] + [a for s in sets for a in ("--set", s)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs whole groups sampled by one policy version" in err[0], err


# --- CLI -----------------------------------------------------------------------------------------------------

PARTIAL = ("algorithm.name=grpo", "train.steps=4", "checkpoint.every=2", "train.async.max_staleness=1",
           "train.async.partial_rollouts=true")


@pytest.mark.slow
def test_cli_partial_rollouts_train_and_resume_exactly(tmp_path):
    train = trained_metrics
    run = train(tmp_path / "partial", *PARTIAL)
    assert [r["async/staleness_max"] for r in run] == [0.0, 1.0, 1.0, 1.0]
    assert [r["async/token_staleness_max"] for r in run] == [0.0, 1.0, 1.0, 1.0]
    assert all(0 < r["async/token_staleness_mean"] < 1 for r in run[1:])  # some tokens by each version
    assert all(r["async/continued_frac"] > 0 for r in run)
    cut = tmp_path / "cut"  # the run as it was after its step-2 checkpoint: step 3's first segment launched
    shutil.copytree(tmp_path / "partial", cut)
    shutil.rmtree(cut / "checkpoints" / "4")
    rows = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("".join(line + "\n" for line in rows if json.loads(line)["step"] <= 2))
    assert train(cut, *PARTIAL) == run
