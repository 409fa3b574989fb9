"""Batched multi-turn decoding: equals a per-episode loop on the single-turn sampler, compiles once per
bucket (not per turn), and its training rows are token-exact (teacher-forced log-probs = sampler's)."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl import sampling
from jaxrl.envs import Action, EpisodeBudget, collect_episodes
from jaxrl.sampling import SamplingSpec, multiturn
from jaxrl.io.tokenizer import builtin_tokenizer
from jaxrl.learner.train_step import sequence_logprobs
from agent_helpers import EchoEnv, tiny_model

TOK = builtin_tokenizer()
RECORDS = [
    {"question": "Who?", "turns": 3, "obs": ["<r>ab</r>", "<r>a longer observation</r>"]},
    {"question": "What is the tallest tower?", "turns": 2, "obs": ["<r>x</r>"]},
]
BUCKETS = dict(prompt_buckets=(128,), gen_buckets=(16,))  # one chunk and one decode shape: few compiles
SLOTS = 512  # carried cache of continue mode: 3 turns fit without compaction (the 128-wide chunks waste room)


@pytest.fixture(scope="module")
def split():
    return nnx.split(tiny_model())


@pytest.fixture(scope="module")
def stops(split):
    """Two stop strings the greedy model really writes (so some turns end on them, others on the budget)."""
    graphdef, state = split
    ids = EchoEnv(TOK).reset(RECORDS[0])
    gen = sampling.generate_from_state(graphdef, state, [ids], max_new_tokens=12, temperature=0.0,
                                       prompt_buckets=(128,), gen_buckets=(16,))
    ids = [int(t) for t in gen.tokens[0]]
    ok = [6 <= t < 102 for t in ids]  # a character of the tokenizer (0-5 are special, 102+ are unused ids)
    single = next(TOK.decode([t]) for i, t in enumerate(ids) if i >= 3 and ok[i])
    pair = next(TOK.decode(ids[i:i + 2]) for i in range(5, len(ids) - 1) if ok[i] and ok[i + 1])
    return (single, pair)


def _specs(*, cache: str = "reprefill", cache_slots: int = 0, **sampling_kw) -> tuple[EpisodeBudget, SamplingSpec]:
    """The tests' episodes: 2 per record, 3 turns of <= 10 tokens in 120, one row shape."""
    budget = EpisodeBudget(max_turns=3, max_total_tokens=120, cache=cache, cache_slots=cache_slots,
                           row_buckets=(128,))
    return budget, SamplingSpec(max_new_tokens=10, num_samples=2, **BUCKETS, **sampling_kw)


def _reference(graphdef, state, record, stops, budget, spec):
    """One episode with `generate_from_state` per turn (greedy), cut at the first stop string / EOS."""
    env = EchoEnv(TOK, stops)
    ctx = env.reset(record)
    seqs = [TOK.encode(s, add_special_tokens=False) for s in stops]
    actions, rewards = [], []
    for _ in range(budget.max_turns):
        room = min(spec.max_new_tokens, budget.max_total_tokens - len(ctx))
        gen = sampling.generate_from_state(graphdef, state, [ctx], max_new_tokens=room, temperature=0.0,
                                           eos_ids=(TOK.eos_token_id,), prompt_buckets=(128,),
                                           gen_buckets=(16,))
        ids = [int(t) for t in gen.tokens[0, : int(gen.lengths[0])]]
        for t in range(len(ids)):
            if any(ids[: t + 1][-len(s):] == s for s in seqs):
                ids = ids[: t + 1]
                break
        eos = ids[-1] == TOK.eos_token_id
        res = env.step(Action(tuple(ids), TOK.decode(ids, skip_special_tokens=True), eos))
        ctx, rewards = ctx + ids, rewards + [res.reward]
        actions.append(ids)
        if res.done or ids[-1] == TOK.eos_token_id:
            break
        ctx = ctx + list(res.observation)
    return ctx, actions, rewards


@pytest.mark.parametrize("mode", ["reprefill", "continue"])
def test_greedy_batched_equals_per_episode_loop(split, stops, mode):
    graphdef, state = split
    budget, spec = _specs(temperature=0.0, cache=mode, cache_slots=SLOTS)
    factory = functools.partial(EchoEnv, stops=stops)
    ep = collect_episodes(graphdef, state, RECORDS, TOK, factory, budget, spec, seed=0)
    assert ep.tokens_BL.shape[0] == 4
    stopped_early = False
    for n in range(4):
        ctx, actions, rewards = _reference(graphdef, state, RECORDS[n // 2], stops, budget, spec)
        stopped_early |= any(len(a) < 10 and a[-1] != TOK.eos_token_id for a in actions)
        row = ep.tokens_BL[n][ep.mask_BL[n]]
        np.testing.assert_array_equal(row, ctx)
        assert ep.turns_B[n] == len(actions)
        np.testing.assert_allclose(ep.turn_rewards_BU[n, : len(rewards)], rewards, rtol=1e-6)
        np.testing.assert_allclose(ep.rewards_B[n], sum(rewards), rtol=1e-6)
        sampled = ep.tokens_BL[n][ep.loss_mask_BL[n]]
        np.testing.assert_array_equal(sampled, [t for a in actions for t in a])
    # some turn ended on a stop string before the budget, and episode 0 ran more than one turn
    assert stopped_early and ep.turns_B.max() >= 2


def _teacher_forced(graphdef, state, ep, temperature: float = 1.0):
    """`jaxrl.learner.train_step.sequence_logprobs` of the rows, aligned with tokens_BL (0 where not computed)."""
    tokens, mask = jnp.asarray(ep.tokens_BL), jnp.asarray(ep.mask_BL)
    width = ep.tokens_BL.shape[1] - ep.prompt_width
    out = np.asarray(sequence_logprobs(state, graphdef, tokens, mask, width, chunk=8192, temperature=temperature))
    return np.pad(out, ((0, 0), (ep.prompt_width, 0)))


def _check_token_exact(graphdef, state, ep, spec):
    """Teacher-forced log-probs of each concatenated row, at the rollout's temperature (what the trainer
    recomputes, `LossSpec.temperature`), equal the sampler's per-turn log-probs (1e-5): the ratio starts at
    exactly 1. A tempered rollout's log-probs are not the untempered policy's; observations are in the row
    (mask 1) but not trained (loss mask 0)."""
    logp = _teacher_forced(graphdef, state, ep, spec.temperature)
    m = ep.loss_mask_BL
    assert m.sum() == ep.action_tokens_B.sum() > 0 and ep.obs_tokens_B.sum() > 0
    assert not m[:, : ep.prompt_width].any()
    np.testing.assert_allclose(ep.old_logp_BL[m], logp[m], atol=1e-5, rtol=0)
    if spec.temperature != 1.0:  # power: the untempered policy is another distribution
        assert np.abs(ep.old_logp_BL[m] - _teacher_forced(graphdef, state, ep)[m]).max() > 1e-2
    assert np.all(ep.old_logp_BL[~m] == 0)
    prompt_B = ep.mask_BL[:, : ep.prompt_width].sum(1)
    np.testing.assert_array_equal(ep.mask_BL.sum(1) - ep.loss_mask_BL.sum(1), ep.obs_tokens_B + prompt_B)


@pytest.mark.parametrize("mode", ["reprefill", "continue"])
def test_rows_are_token_exact_under_sampling(split, stops, mode):
    """`_check_token_exact` at τ = 1 in both cache modes (τ = 0.7 with top-k / top-p: in
    `test_no_recompile_across_turns_or_rollouts`, which compiles that setting)."""
    graphdef, state = split
    budget, spec = _specs(cache=mode, cache_slots=SLOTS, temperature=1.0)
    factory = functools.partial(EchoEnv, stops=stops)
    ep = collect_episodes(graphdef, state, RECORDS, TOK, factory, budget, spec, seed=5)
    _check_token_exact(graphdef, state, ep, spec)


def test_continue_equals_reprefill_and_compaction(split, stops):
    """Same seed, same sampled tokens for both cache policies, also when a tiny cache forces compaction."""
    graphdef, state = split
    factory = functools.partial(EchoEnv, stops=stops)
    rows = {}
    for mode, slots in (("reprefill", 0), ("continue", SLOTS), ("continue", 200)):
        budget, spec = _specs(temperature=1.0, cache=mode, cache_slots=slots)
        ep = collect_episodes(graphdef, state, RECORDS, TOK, factory, budget, spec, seed=9)
        rows[(mode, slots)] = ep
    base = rows[("reprefill", 0)]
    for key in (("continue", SLOTS), ("continue", 200)):
        np.testing.assert_array_equal(rows[key].tokens_BL, base.tokens_BL)
        np.testing.assert_allclose(rows[key].old_logp_BL, base.old_logp_BL, atol=1e-5)
    assert rows[("continue", 200)].metrics["rollout/cache_compactions"] >= 1
    assert rows[("continue", SLOTS)].metrics["rollout/cache_compactions"] == 0
    prefill = rows[("continue", SLOTS)].metrics["rollout/prefill_tokens"]
    assert prefill < base.metrics["rollout/prefill_tokens"]


def test_no_recompile_across_turns_or_rollouts(split, stops):
    """A rollout compiles the turn function once per (chunk bucket, fresh or carried cache), not per turn.
    Its sampling setting, compiled by no other test (issue 33 item 5: the tempered policy with top-k and
    top-p), is also checked token-exact (`_check_token_exact`): the two checks share its two programs."""
    graphdef, state = split
    budget, spec = _specs(temperature=0.7, top_k=40, top_p=0.9, cache="continue", cache_slots=SLOTS)
    factory = functools.partial(EchoEnv, stops=stops)
    before = multiturn.compile_count()
    ep = collect_episodes(graphdef, state, RECORDS, TOK, factory, budget, spec, seed=1)
    assert ep.turns_B.max() == 3 and multiturn.compile_count() - before == 2  # fresh cache + carried cache
    before = multiturn.compile_count()
    for seed in (2, 3):  # other seeds: other turn counts and lengths, same buckets
        collect_episodes(graphdef, state, RECORDS, TOK, factory, budget, spec, seed=seed)
    assert multiturn.compile_count() == before
    _check_token_exact(graphdef, state, ep, spec)


def test_scan_and_per_layer_decode_agree(split, stops):
    """The accelerator path (layer scan, stacked carried cache) gives the per-layer path's tokens."""
    graphdef, state = split
    ctx = [EchoEnv(TOK).reset(r) for r in RECORDS for _ in range(2)]
    out = {}
    for per_layer in (True, False):  # the same shapes as collect_episodes in the tests above (no new compile)
        dec = multiturn.TurnDecoder(graphdef, state, 4, max_new_tokens=10, temperature=1.0, seed=4,
                                    mode="continue", cache_slots=SLOTS, chunk_buckets=(128,),
                                    gen_buckets=(16,),
                                    per_layer=per_layer, eos_ids=(TOK.eos_token_id,),
                                    stop_sequences=multiturn.stop_token_sequences(TOK, stops))
        first = dec.turn(0, ctx, [10] * 4)
        nxt = [c + [int(t) for t in first.tokens[i, : first.lengths[i]]] + [40, 41]
               for i, c in enumerate(ctx)]
        out[per_layer] = (first, dec.turn(1, nxt, [10, 10, 0, 10]))
    for a, b in zip(out[True], out[False]):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_stop_sequences_end_turns_and_none_means_budget(split):
    """Without stop sequences a turn runs to its budget (or EOS); with one, it ends right after the match."""
    graphdef, state = split
    ctx = [EchoEnv(TOK).reset(r) for r in RECORDS for _ in range(2)]
    kw = dict(max_new_tokens=10, temperature=1.0, seed=6, chunk_buckets=(128,), gen_buckets=(16,))
    free = multiturn.TurnDecoder(graphdef, state, 4, **kw).turn(0, ctx, [10, 7, 0, 10])
    np.testing.assert_array_equal(free.lengths, [10, 7, 0, 10])
    assert not free.stopped.any()
    stop = [int(t) for t in free.tokens[0, 3:5]]  # a 2-token sequence row 0 really samples
    cut = multiturn.TurnDecoder(graphdef, state, 4, stop_sequences=[stop], **kw).turn(0, ctx, [10, 7, 0, 10])
    assert cut.lengths[0] <= 5 and cut.stopped[0]
    for i in range(4):
        n = int(cut.lengths[i])
        np.testing.assert_array_equal(cut.tokens[i, :n], free.tokens[i, :n])
        seq = [int(t) for t in free.tokens[i, : free.lengths[i]]]
        first = next((t + 1 for t in range(1, len(seq)) if seq[t - 1:t + 1] == stop), free.lengths[i])
        ends_on_stop = first < free.lengths[i] or seq[first - 2:first] == stop
        assert n == first and bool(cut.stopped[i]) == ends_on_stop


def test_idle_row_that_comes_back_is_prefilled_again(split, stops):
    """Continue mode: a row idle for a turn (and a compaction meanwhile) resumes exactly like re-prefill."""
    graphdef, state = split
    ctx0 = [EchoEnv(TOK).reset(r) for r in RECORDS for _ in range(2)]
    kw = dict(max_new_tokens=10, temperature=1.0, seed=8, chunk_buckets=(128,), gen_buckets=(16,),
              eos_ids=(TOK.eos_token_id,), stop_sequences=multiturn.stop_token_sequences(TOK, stops))
    budgets = [[10, 10, 10, 10], [10, 10, 0, 10], [10, 10, 10, 10]]
    turns = {}
    for mode, slots in (("reprefill", 0), ("continue", SLOTS), ("continue", 200)):
        dec = multiturn.TurnDecoder(graphdef, state, 4, mode=mode, cache_slots=slots, **kw)
        ctx, out = [list(c) for c in ctx0], []
        for k, b in enumerate(budgets):
            t = dec.turn(k, [c if m else None for c, m in zip(ctx, b)], b)
            out.append(t)
            ctx = [c + [int(x) for x in t.tokens[i, : t.lengths[i]]] + ([50 + k] * (k + 1) if b[i] else [])
                   for i, c in enumerate(ctx)]
        turns[(mode, slots)] = (out, dec.stats["compactions"])
    assert turns[("continue", 200)][1] >= 1 and turns[("continue", SLOTS)][1] == 0
    assert turns[("reprefill", 0)][0][1].lengths[2] == 0
    for key in (("continue", SLOTS), ("continue", 200)):
        for a, b in zip(turns[("reprefill", 0)][0], turns[key][0]):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
