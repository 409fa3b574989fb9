"""Multi-turn episodes on the continuous slot engine (`jaxrl.sampling.episode_slots`, issue 33 item 2).

With fewer slots than episodes (slots reused), episodes of different lengths and turn counts give the tokens of
the lockstep turn decoder (`TurnDecoder`, cache "continue") for the same seed, greedy and sampled (with top-k
and top-p); their log-probs agree to 1e-6: the slot engine keeps an episode's keys contiguous from cache slot 0,
the turn decoder after left padding, and XLA:CPU's attention sums group the terms by slot, so a few decode
steps round differently in the last bit (4.8e-7 at most seen; the first token of each turn, from the prefill,
is equal). A slot waiting for its environment keeps its episode; a finished episode frees its slot to the next
one in order; returning to the host mid-turn does not change the tokens; nothing recompiles across rollouts.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl.config import load_config
from jaxrl.envs import EpisodeBudget, collect_episodes
from jaxrl.envs.slot_episodes import SlotScheduler
from jaxrl.io.tokenizer import builtin_tokenizer
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.rl import agentic
from jaxrl.rl.setup import sampling_spec
from jaxrl.sampling import SamplingSpec, episode_slots
from jaxrl.sharding import RULES, hosts, MeshConfig, make_constrain, make_mesh, row_sharding, state_shardings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_helpers import EchoEnv, tiny_model  # noqa: E402

TOK = builtin_tokenizer()
RECORDS = [  # 1 to 3 turns, observations of different lengths; G = 2: 6 episodes
    {"question": "Who?", "turns": 3, "obs": ["<r>ab</r>", "<r>a longer observation</r>"]},
    {"question": "What is the tallest tower?", "turns": 2, "obs": ["<r>x</r>"]},
    {"question": "Why so?", "turns": 1, "obs": []},
]
STOPS = ("e", "th")  # letters the tiny model writes: some turns end on a stop sequence, others on the budget
BUDGET = EpisodeBudget(max_turns=3, max_total_tokens=120, cache="continue", cache_slots=512, row_buckets=(128,))
LOGP_ATOL = 1e-6  # last-bit rounding of the attention sums (module docstring); tokens are compared exactly


@pytest.fixture(scope="module")
def split():
    return nnx.split(tiny_model())


def _spec(**kw) -> SamplingSpec:
    return SamplingSpec(max_new_tokens=10, num_samples=2, prompt_buckets=(128,), gen_buckets=(16,), **kw)


def _assert_same_episodes(cont, static):
    np.testing.assert_array_equal(cont.tokens_BL, static.tokens_BL)
    for field in ("mask_BL", "loss_mask_BL", "turns_B", "lengths_B", "finished_B", "action_tokens_B",
                  "obs_tokens_B", "turn_rewards_BU", "rewards_B"):
        np.testing.assert_array_equal(getattr(cont, field), getattr(static, field), err_msg=field)
    np.testing.assert_allclose(cont.old_logp_BL, static.old_logp_BL, atol=LOGP_ATOL, rtol=0)
    assert cont.completions == static.completions


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1.0),
                                dict(temperature=0.7, top_k=40, top_p=0.9)])
def test_same_episodes_as_the_lockstep_turn_decoder(split, kw):
    graphdef, state = split
    factory = functools.partial(EchoEnv, stops=STOPS)
    static = collect_episodes(graphdef, state, RECORDS, TOK, factory, BUDGET, _spec(**kw), seed=3)
    cont = collect_episodes(graphdef, state, RECORDS, TOK, factory, BUDGET,
                            _spec(engine="continuous", slots=2, **kw), seed=3)  # 2 slots for 6 episodes
    _assert_same_episodes(cont, static)
    assert sorted(set(static.turns_B.tolist())) == [1, 2, 3]
    actions = [len(a) for row in static.loss_mask_BL for a in "".join("x" if m else " " for m in row).split()]
    if kw["temperature"]:  # turns ended on a stop sequence and on the budget (the greedy ones run to 10)
        assert min(actions) < 10 == max(actions), actions
    assert cont.metrics["rollout/cache_compactions"] == 0 and cont.metrics["rollout/decode_steps"] > 0
    assert static.metrics["rollout/cache_compactions"] == 0  # then both prefilled the same chunks
    assert cont.metrics["rollout/prefill_tokens"] == static.metrics["rollout/prefill_tokens"]


def test_the_config_edge_picks_the_engine_and_no_recompile(split):
    """`rollout.engine.kind: continuous` with `env:` loads, reaches `collect_env` through `sampling_spec`, and
    gives the static engine's rollout; other seeds compile nothing new."""
    graphdef, state = split
    cfg = load_config("configs/agentic_rl_tiny.yaml", ["rollout.engine.kind=continuous", "rollout.engine.slots=4"])
    spec = dataclasses.replace(sampling_spec(cfg), max_new_tokens=10, num_samples=2, temperature=1.0,
                               prompt_buckets=(128,), gen_buckets=(16,))
    assert (spec.engine, spec.slots) == ("continuous", 4)
    factory = functools.partial(EchoEnv, stops=STOPS)
    run = lambda s, seed: agentic.collect_env(graphdef, state, RECORDS, TOK, [], factory, BUDGET, s, seed)  # noqa: E731
    cont, static = run(spec, 11), run(dataclasses.replace(spec, engine="static", slots=None), 11)
    np.testing.assert_array_equal(np.asarray(cont.tokens_BL), np.asarray(static.tokens_BL))
    np.testing.assert_allclose(np.asarray(cont.old_logp_BT), np.asarray(static.old_logp_BT), atol=LOGP_ATOL)
    np.testing.assert_array_equal(cont.rewards_BR, static.rewards_BR)
    before = episode_slots.compile_count()
    for seed in (12, 13):
        run(spec, seed)
    assert episode_slots.compile_count() == before


def _two_device_model():
    """(graphdef, sharded state, mesh, rules) of the tiny model whose rows (the slots) split over 2 devices."""
    cfg = TransformerConfig.tiny(vocab_size=128, max_position_embeddings=512)
    mesh = make_mesh(MeshConfig(data=2), jax.devices()[:2])
    rules = RULES["fsdp"]
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0), constrain=make_constrain(mesh, rules)))
    return graphdef, jax.device_put(state, state_shardings(state, mesh, rules)), mesh, rules


def test_slots_sharded_over_devices(split):
    """One process, the slots split over a 2-device mesh (the model pins them as batch rows, as in a training
    run): the single-device engine's episodes, bit for bit."""
    graphdef, state, mesh, rules = _two_device_model()
    factory = functools.partial(EchoEnv, stops=STOPS)
    spec = _spec(engine="continuous", slots=4, temperature=1.0)
    one = collect_episodes(*split, RECORDS, TOK, factory, BUDGET, spec, seed=3)
    two = collect_episodes(graphdef, state, RECORDS, TOK, factory, BUDGET, spec, seed=3,
                           row_sharding=row_sharding(mesh, rules, 6))
    np.testing.assert_array_equal(two.tokens_BL, one.tokens_BL)
    np.testing.assert_array_equal(two.old_logp_BL, one.old_logp_BL)


class _Scripted:
    """An episode whose environment answers every action with `obs` for `turns` turns."""

    def __init__(self, prompt, turns, obs):
        self.context, self.rewards, self.done, self.turns, self.obs = list(prompt), [], False, turns, list(obs)

    def act(self, ids, logp):
        self.context += ids
        self.rewards.append(0.0)
        self.done = len(self.rewards) >= self.turns
        if not self.done:
            self.context += self.obs


def test_slots_are_held_while_waiting_and_freed_when_done(split):
    """5 episodes, 2 slots, the host called back as soon as one turn ends: a slot is fed its own episode's next
    turns until that episode is done, and only then the next pending episode, in order."""
    graphdef, state = split
    eps = [_Scripted([7 + i, 20, 30 + i], turns, [40 + i] * (1 + i)) for i, turns in enumerate((3, 1, 2, 2, 1))]
    dec = episode_slots.SlotDecoder(graphdef, state, 2, max_context=120, max_new_tokens=6, temperature=1.0,
                                    seed=2, gen_buckets=(16,), min_waiting=1)
    log, feed = [], dec.feed

    def recording_feed(slots, contexts, rows, turns, budgets, fresh):
        log.extend((s, r, k, new, [e.done for e in eps]) for s, r, k, new in zip(slots, rows, turns, fresh))
        feed(slots, contexts, rows, turns, budgets, fresh)

    dec.feed = recording_feed
    sched = SlotScheduler(dec, eps, range(100, 105), max_new_tokens=6, max_total_tokens=120)
    sched.run(lambda i, ids, logp: eps[i].act(ids, logp))
    assert all(e.done for e in eps) and [len(e.rewards) for e in eps] == [3, 1, 2, 2, 1]
    assert [i for i, _ in sched.admitted] == [0, 1, 2, 3, 4]  # in episode order
    assert len({s for _, s in sched.admitted}) == 2 and len(sched.admitted) == 5  # slots reused
    holder = {}
    for s, row, k, new, done in log:
        if new:  # a slot takes a new episode only once its last one is done
            assert s not in holder or done[holder[s] - 100], (s, row)
            holder[s] = row
            assert k == 0
        else:  # a waiting slot is fed its own episode's next turn
            assert holder[s] == row and k >= 1
    assert sorted(r for _, r, _, _, _ in log) == sorted(100 + i for i, e in enumerate(eps) for _ in e.rewards)
    assert dec.stats["advances"] > 3  # the host was called back between turns (min_waiting = 1)


def test_returning_mid_turn_keeps_the_tokens(split):
    """`advance` returns once `min_waiting` turns ended; the other slots resume where they were, so the
    tokens equal one uninterrupted call's. A slot still decoding, or a context that does not extend the cache,
    cannot be fed."""
    graphdef, state = split
    ctx = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    kw = dict(max_context=60, max_new_tokens=8, temperature=1.0, seed=5, gen_buckets=(16,))
    whole = episode_slots.SlotDecoder(graphdef, state, 3, min_waiting=3, **kw)
    whole.feed([0, 1, 2], ctx, [0, 1, 2], [0, 0, 0], [2, 8, 5], [True] * 3)
    ref = whole.advance()
    assert ref.ended.all() and list(ref.lengths) == [2, 8, 5]
    split_dec = episode_slots.SlotDecoder(graphdef, state, 3, min_waiting=1, **kw)
    split_dec.feed([0, 1, 2], ctx, [0, 1, 2], [0, 0, 0], [2, 8, 5], [True] * 3)
    first = split_dec.advance()
    assert first.steps == 2 and list(first.ended) == [True, False, False]
    with pytest.raises(ValueError, match="slot 1 is still decoding"):
        split_dec.feed([1], [ctx[1] + [1]], [1], [1], [4], [False])
    with pytest.raises(ValueError, match="slot 0: the context does not extend"):
        split_dec.feed([0], [[5, 6, 9, 1]], [0], [1], [4], [False])
    second = split_dec.advance()
    assert list(second.ended) == [False, False, True]  # slot 0 keeps waiting: it is not counted again
    third = split_dec.advance()
    assert list(third.ended) == [False, True, False] and not split_dec.decoding.any()
    np.testing.assert_array_equal(third.tokens, ref.tokens)
    np.testing.assert_array_equal(third.logprobs, ref.logprobs)
    assert split_dec.advance().steps == 0  # no slot decodes: returns at once
    scan = episode_slots.SlotDecoder(graphdef, state, 3, min_waiting=3, per_layer=False, **kw)  # the layer scan,
    scan.feed([0, 1, 2], ctx, [0, 1, 2], [0, 0, 0], [2, 8, 5], [True] * 3)  # stacked cache (accelerators)
    np.testing.assert_array_equal(scan.advance().tokens, ref.tokens)


def test_bad_slots_are_one_line(split):
    graphdef, state = split
    factory = functools.partial(EchoEnv, stops=STOPS)
    for slots in (1, 7):
        with pytest.raises(ValueError, match=r"slots must be in \[2, 6\]"):
            collect_episodes(graphdef, state, RECORDS, TOK, factory, BUDGET, _spec(engine="continuous",
                                                                                   slots=slots), seed=0)


def test_a_host_drives_its_own_episodes_in_its_own_slots(split, monkeypatch):
    """Process 0 of a two-host layout on one process (the owners of the 6 episodes and of the 4 slots faked:
    the first half of each is process 0's): it starts only its 3 episodes, admits them into only its 2 slots,
    and they get the tokens and log-probs they have when one host drives all 6 (the other host's rows pad)."""
    graphdef, state, mesh, rules = _two_device_model()
    factory = functools.partial(EchoEnv, stops=STOPS)
    spec = _spec(engine="continuous", slots=4, temperature=1.0)
    run = lambda: collect_episodes(graphdef, state, RECORDS, TOK, factory, BUDGET, spec, seed=3,  # noqa: E731
                                   row_sharding=row_sharding(mesh, rules, 6))
    one = run()
    admitted, make = [], SlotScheduler.__init__

    def recording_init(self, decoder, episodes, *a, **kw):
        make(self, decoder, episodes, *a, **kw)
        admitted.append((self, decoder))

    real_owners = hosts.row_owners
    monkeypatch.setattr(hosts, "row_owners", lambda sh, shape: (np.arange(shape[0]) >= shape[0] // 2).astype(
        np.int32) if shape[0] in (4, 6) else real_owners(sh, shape))
    monkeypatch.setattr(SlotScheduler, "__init__", recording_init)
    mine = run()
    (sched, dec), = admitted
    assert list(dec.owned_S) == [True, True, False, False]
    assert sorted(i for i, _ in sched.admitted) == [0, 1, 2] and {s for _, s in sched.admitted} == {0, 1}
    assert list(mine.driven_B) == [True] * 3 + [False] * 3
    np.testing.assert_array_equal(mine.tokens_BL[:3], one.tokens_BL[:3])
    np.testing.assert_array_equal(mine.old_logp_BL[:3], one.old_logp_BL[:3])
    assert mine.completions[:3] == one.completions[:3] and mine.completions[3:] == [""] * 3
    with pytest.raises(ValueError, match="slot 2 belongs to process 1"):
        dec.feed([2], [[5, 6]], [0], [0], [4], [True])
