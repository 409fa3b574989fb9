"""`generate` on a random tiny Transformer: logprobs vs teacher forcing, EOS, groups, seeds, compiles.

The teacher-forced reference forward is jitted (eager dispatch compiled one small program per primitive and
shape), and the frequency test's peaked vocabulary-12 model and its logits are built once for its three cases.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from jaxrl import sampling
from jaxrl.models import Transformer, TransformerConfig
from sampling_refs import chi2_pvalue, ref_probs

PROMPTS = [[5, 9, 3], [7, 1, 4, 4, 8, 12, 30], [11, 6, 20, 21, 22]]


@pytest.fixture(scope="module")
def model():
    return Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))


@nnx.jit
def _forward_logits(model, tokens_BL, mask_BL):
    return model.forward(tokens_BL, mask_BL=mask_BL).logits


def _teacher_forced_logp(model, prompts, completions):
    """float64 log-softmax [B, T, V] at the completion positions, from one left-padded forward pass."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(map(len, seqs))
    tokens = np.zeros((len(seqs), width), np.int32)
    mask = np.zeros((len(seqs), width), bool)
    for b, s in enumerate(seqs):
        tokens[b, width - len(s):], mask[b, width - len(s):] = s, True
    logits_BLV = _forward_logits(model, jnp.asarray(tokens), jnp.asarray(mask))
    logp_BLV = np.asarray(jax.nn.log_softmax(logits_BLV, axis=-1), np.float64)
    t = len(completions[0])
    return logp_BLV[:, width - t - 1:width - 1]


def test_logprobs_equal_teacher_forced_forward(model):
    gen = sampling.generate(model, PROMPTS, max_new_tokens=6, num_samples=2, temperature=1.0, seed=3)
    assert gen.tokens.shape == (6, 6) and gen.logprobs.shape == (6, 6)
    tokens = np.asarray(gen.tokens)
    prompts = [PROMPTS[p] for p in np.asarray(gen.prompt_index)]
    logp_BTV = _teacher_forced_logp(model, prompts, tokens)
    expected = np.take_along_axis(logp_BTV, tokens[:, :, None], axis=-1)[:, :, 0]
    np.testing.assert_allclose(np.asarray(gen.logprobs), expected, atol=2e-5, rtol=0)


@pytest.mark.parametrize("kwargs", [dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.6)])
def test_logprobs_are_the_tempered_policy_the_trainer_recomputes(model, kwargs):
    """Issue 33 item 5: at τ != 1, with or without top-k / top-p, the sampler's log-probs are log softmax(z/τ)
    over the whole vocabulary at the chosen token, which is what the trainer's forward computes at
    `LossSpec.temperature` = τ: the PPO ratio is exactly 1 (1e-5 in log space) before the first update."""
    from jaxrl.learner.train_step import token_logprobs

    gen = sampling.generate(model, PROMPTS, max_new_tokens=6, num_samples=2, seed=3, **kwargs)
    tokens = np.asarray(gen.tokens)
    prompts = [PROMPTS[p] for p in np.asarray(gen.prompt_index)]
    width = max(map(len, PROMPTS))
    rows, mask = np.zeros((len(prompts), width + 6), np.int32), np.zeros((len(prompts), width + 6), bool)
    for b, (p, c) in enumerate(zip(prompts, tokens)):
        rows[b, width - len(p):] = [*p, *c]
        mask[b, width - len(p):] = True
    trainer = lambda tau: np.asarray(token_logprobs(model, jnp.asarray(rows), jnp.asarray(mask), 6, chunk=8192,
                                                    temperature=tau)[0])
    np.testing.assert_allclose(np.asarray(gen.logprobs), trainer(kwargs["temperature"]), atol=1e-5, rtol=0)
    assert np.abs(np.asarray(gen.logprobs) - trainer(1.0)).max() > 1e-2  # power: τ = 1 is another policy


def test_greedy_tokens_are_teacher_forced_argmax(model):
    gen = sampling.generate(model, PROMPTS, max_new_tokens=5, temperature=0.0)
    tokens = np.asarray(gen.tokens)
    np.testing.assert_array_equal(tokens, _teacher_forced_logp(model, PROMPTS, tokens).argmax(-1))


def test_eos_stops_row_and_pads(model):
    free = sampling.generate(model, PROMPTS, max_new_tokens=8, temperature=0.0)
    tokens = np.asarray(free.tokens)
    assert np.all(np.asarray(free.lengths) == 8) and not np.any(np.asarray(free.finished))
    eos = int(tokens[0, 2])
    gen = sampling.generate(model, PROMPTS, max_new_tokens=8, temperature=0.0, eos_ids=(eos,), pad_id=63)
    for p in range(len(PROMPTS)):
        hits = np.flatnonzero(tokens[p] == eos)
        n = int(hits[0]) + 1 if hits.size else 8
        assert int(gen.lengths[p]) == n and bool(gen.finished[p]) == bool(hits.size)
        np.testing.assert_array_equal(np.asarray(gen.tokens[p, :n]), tokens[p, :n])
        assert np.all(np.asarray(gen.tokens[p, n:]) == 63)
        assert np.all(np.asarray(gen.logprobs[p, n:]) == 0.0)
        np.testing.assert_allclose(np.asarray(gen.logprobs[p, :n]), np.asarray(free.logprobs[p, :n]),
                                   atol=1e-6)
    assert int(gen.lengths[0]) <= 3


def test_group_structure_and_single_prefill(model, monkeypatch):
    calls = []
    original = Transformer.forward

    def spy(self, tokens_BL, *args, **kwargs):
        calls.append(tuple(tokens_BL.shape))
        return original(self, tokens_BL, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", spy)
    gen = sampling.generate(model, PROMPTS, max_new_tokens=4, num_samples=3, temperature=1.0, seed=11,
                            prompt_buckets=(16,), gen_buckets=(8,))
    # Traced once: one prefill of the P prompts, then one decode forward over the P*G rows.
    assert calls == [(3, 16), (9, 1)]
    np.testing.assert_array_equal(np.asarray(gen.prompt_index), [0, 0, 0, 1, 1, 1, 2, 2, 2])
    greedy = sampling.generate(model, PROMPTS, max_new_tokens=4, num_samples=3, temperature=0.0)
    for p in range(3):
        np.testing.assert_array_equal(np.asarray(greedy.tokens[3 * p]), np.asarray(greedy.tokens[3 * p + 2]))
    assert len({tuple(np.asarray(gen.tokens[r]).tolist()) for r in range(9)}) > 3


def test_deterministic_for_a_seed(model):
    a = sampling.generate(model, PROMPTS, max_new_tokens=6, num_samples=2, seed=5)
    b = sampling.generate(model, PROMPTS, max_new_tokens=6, num_samples=2, seed=5)
    c = sampling.generate(model, PROMPTS, max_new_tokens=6, num_samples=2, seed=6)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_no_recompile_within_a_bucket(model):
    kw = dict(num_samples=2, prompt_buckets=(8, 16), gen_buckets=(8,), seed=1)
    sampling.generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=5, temperature=0.9, **kw)
    before = sampling.compile_count()
    sampling.generate(model, [[6, 7, 8, 9, 10, 11, 12], [4]], max_new_tokens=8, temperature=0.7, **kw)
    sampling.generate(model, [[6], [7, 8]], max_new_tokens=3, temperature=1.3, top_p=None, **kw)
    assert sampling.compile_count() == before
    sampling.generate(model, [[1] * 9, [4, 5]], max_new_tokens=5, temperature=0.9, **kw)  # next prompt bucket
    assert sampling.compile_count() == before + 1


def _compiled_hlo(calls) -> list[str]:
    """The optimised HLO of each recorded `(jitted rollout, args, kwargs)` call: JAX's cache returns the
    executable the call ran (the same arguments), so nothing is compiled again."""
    return [fn.lower(*args, **kwargs).compile().as_text() for fn, args, kwargs in calls]


@pytest.mark.parametrize("changes", [
    dict(), dict(family="qwen3", qk_norm=True, norm="siamese"), dict(family="qwen2", qkv_bias=True, norm="post"),
])
def test_per_layer_decode_equals_layer_scan(changes, monkeypatch):
    """The CPU default (per-layer weight/cache buffers) samples the same tokens with the same logprobs.

    Both CPU rollout programs, as run, are compiled without YNNPACK library fusions (`engine.CPU_DECODE_OPTIONS`):
    inside the decode loop YNNPACK took 23 ms per few-row MLP dot that XLA's own dot does in well under 1 ms
    (benchmarks/RESULTS.md). The control, once: the default program (`engine.rollout`) for the layer scan's
    arguments does hand dots to YNNPACK on this CPU."""
    tiny = Transformer(TransformerConfig.tiny(num_layers=3, **changes), rngs=nnx.Rngs(4))
    kw = dict(max_new_tokens=7, num_samples=3, temperature=1.0, top_p=0.9, seed=2, eos_ids=(17,),
              gen_buckets=(7 + len(changes),))  # a bucket of its own: the first call below traces
    calls, rollouts = [], []
    original = Transformer.layer_states
    monkeypatch.setattr(Transformer, "layer_states", lambda self: calls.append(1) or original(self))
    rollout_for = sampling.rollout_for

    def recording(**which):
        fn = rollout_for(**which)
        return lambda *args, **kwargs: rollouts.append((fn, args, kwargs)) or fn(*args, **kwargs)

    monkeypatch.setattr(sampling, "rollout_for", recording)
    default = sampling.generate(tiny, PROMPTS, **kw)
    assert calls  # the default on CPU is the per-layer decode
    split = sampling.generate(tiny, PROMPTS, per_layer=True, **kw)
    scan = sampling.generate(tiny, PROMPTS, per_layer=False, **kw)
    np.testing.assert_array_equal(np.asarray(default.tokens), np.asarray(split.tokens))
    np.testing.assert_array_equal(np.asarray(split.tokens), np.asarray(scan.tokens))
    np.testing.assert_array_equal(np.asarray(split.lengths), np.asarray(scan.lengths))
    np.testing.assert_allclose(np.asarray(split.logprobs), np.asarray(scan.logprobs), atol=1e-6, rtol=0)
    assert [kwargs["per_layer"] for _, _, kwargs in rollouts] == [True, True, False], rollouts
    for (_, _, kwargs), hlo in zip(rollouts[1:], _compiled_hlo(rollouts[1:])):
        assert "ynn_fusion" not in hlo, f"per_layer={kwargs['per_layer']}: a CPU decode program uses YNNPACK"
    if not changes:  # the control: compiled anew with XLA:CPU's default options
        from jaxrl.sampling import engine

        _, args, kwargs = rollouts[2]
        assert "ynn_fusion" in _compiled_hlo([(engine.rollout, args, kwargs)])[0], \
            "control: the default rollout program hands no dot to YNNPACK, so the check above shows nothing"


def test_top_k_one_is_greedy(model):
    greedy = sampling.generate(model, PROMPTS, max_new_tokens=5, temperature=0.0)
    top1 = sampling.generate(model, PROMPTS, max_new_tokens=5, temperature=1.7, top_k=1, seed=4)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), np.asarray(top1.tokens))


@functools.cache
def _peaked_model():
    """(model, prompt, float64 next-token logits) of a random vocabulary-12 model with spread logits."""
    small = Transformer(TransformerConfig.tiny(vocab_size=12), rngs=nnx.Rngs(1))
    small.lm_head.kernel[...] = small.lm_head.kernel[...] * 20.0  # spread the logits: a peaked distribution
    prompt = [3, 7, 1]
    return small, prompt, np.asarray(small(jnp.asarray([prompt]))[0, -1], np.float64)


@pytest.mark.parametrize("kwargs,ref", [
    (dict(temperature=1.0), dict()),
    (dict(temperature=0.7, top_k=5), dict(temperature=0.7, top_k=5)),
    (dict(temperature=1.0, top_p=0.6), dict(top_p=0.6)),
])
def test_first_token_frequencies_match_model_distribution(kwargs, ref):
    small, prompt, logits_V = _peaked_model()
    n = 6000
    gen = sampling.generate(small, [prompt], max_new_tokens=1, num_samples=n, seed=0, **kwargs)
    counts = np.bincount(np.asarray(gen.tokens[:, 0]), minlength=12)
    assert chi2_pvalue(counts, ref_probs(logits_V, **ref)) > 1e-3
    if not ref:  # power check: a 1.3x sharper distribution is rejected
        assert stats.chisquare(counts, n * ref_probs(logits_V, temperature=1 / 1.3)).pvalue < 1e-4


def test_same_tokens_on_one_and_eight_devices(model):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    assert len(jax.devices()) == 8
    prompts = [[i + 1, 2 * i + 3, 5] + [7] * i for i in range(8)]
    single = sampling.generate(model, prompts, max_new_tokens=6, num_samples=2, seed=9)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
    sharded = sampling.generate_from_state(
        graphdef, state, prompts, max_new_tokens=6, num_samples=2, seed=9,
        batch_sharding=NamedSharding(mesh, PartitionSpec("data")),
    )
    assert len(sharded.tokens.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(single.tokens), np.asarray(sharded.tokens))
    np.testing.assert_allclose(np.asarray(single.logprobs), np.asarray(sharded.logprobs), atol=1e-5)


@pytest.mark.parametrize("prompts,kwargs,match", [
    ([], dict(), "non-empty list"),
    ([[1, 2]], dict(eos_ids=(64,)), r"eos_ids \[64\] are outside the vocabulary \[0, 64\)"),
    ([[1, 2]], dict(temperature=-1.0), "temperature must be >= 0"),
    ([[1] * 20], dict(prompt_buckets=(8, 16)),
     r"prompt of 20 tokens exceeds the largest prompt bucket \(16\)"),
    ([[1] * 100], dict(max_new_tokens=40), "exceeds max_position_embeddings"),
])
def test_bad_input_is_a_clear_error(model, prompts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sampling.generate(model, prompts, **{"max_new_tokens": 4, **kwargs})
