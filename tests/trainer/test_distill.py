"""On-policy distillation (`jaxrl.rl.distill`): the advantage form against tinker-cookbook's rule written out
by hand, the loss form's gradient against the exact reverse-KL gradient, and the teacher checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import losses
from jaxrl.errors import ConfigError
from jaxrl.rl.distill import discounted_future_sum_BT, distill_advantages_BT
from jaxrl.runtime.run_checks import check_same_tokenizer


def _tinker_rule(adv, old, teacher, mask, coef, discount):
    """tinker-cookbook `incorporate_kl_penalty`, one row at a time in plain Python: kl_adv = −coef · mask ·
    (sampled − teacher), then (discount > 0) its discounted future sum, added to the advantages."""
    out = np.array(adv, np.float64)
    for b in range(len(adv)):
        kl_adv = [-coef * m * (s - t) for s, t, m in zip(old[b], teacher[b], mask[b])]
        if discount > 0:
            acc, summed = 0.0, []
            for x in reversed(kl_adv):
                acc = x + discount * acc
                summed.append(acc)
            kl_adv = summed[::-1]
        out[b] += kl_adv
    return out


@pytest.mark.parametrize("discount", [0.0, 0.5, 1.0])
def test_advantages_follow_the_tinker_rule(discount):
    adv = [[0.5, 0.5, 0.5, 0.0], [-1.0, -1.0, 0.0, 0.0]]
    old = [[-0.1, -2.0, -0.7, 0.0], [-1.5, -0.2, 0.0, 0.0]]
    teacher = [[-0.3, -0.5, -0.7, 0.0], [-0.1, -3.0, 0.0, 0.0]]
    mask = [[True, True, True, False], [True, True, False, False]]
    got = distill_advantages_BT(*(jnp.asarray(x, jnp.float32) for x in (adv, old, teacher)),
                                jnp.asarray(mask), coef=0.5, discount=discount)
    want = _tinker_rule(adv, old, teacher, mask, 0.5, discount)
    # the trained tokens only: tinker's discounted sum also runs over masked positions, whose advantage the
    # loss never reads (here they are trailing padding, so the sums agree everywhere on the mask)
    np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, want, 0), rtol=1e-6, atol=1e-7)
    # hand-computed, γ = 0: A − c·(old − teacher) on the mask, A itself off it
    if discount == 0.0:
        np.testing.assert_allclose(np.asarray(got)[0], [0.5 - 0.5 * 0.2, 0.5 + 0.5 * 1.5, 0.5, 0.0], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(got)[1], [-1.0 + 0.5 * 1.4, -1.0 - 0.5 * 2.8, 0.0, 0.0],
                                   rtol=1e-6)


def test_discounted_future_sum_by_hand():
    x = jnp.asarray([[1.0, 2.0, 4.0]])
    np.testing.assert_allclose(discounted_future_sum_BT(x, 0.5), [[1 + 1 + 1, 2 + 2, 4]], rtol=1e-6)
    np.testing.assert_array_equal(discounted_future_sum_BT(x, 0.0), x)


def _categorical(seed: int, vocab: int = 7):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, (vocab,)) * 0.7, jax.random.normal(k2, (vocab,)) * 0.7  # k3 unclipped


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k2_loss_gradient_is_the_reverse_kl_gradient_on_policy(seed):
    """Expected over y ~ π_θ (every token, weighted exactly), ∇ of k2(log π_θ(y), log π_T(y)) is ∇KL(π_θ ‖ π_T)
    (why `distill.kind` defaults to k2); k3's is ∇KL(π_T ‖ π_θ), the forward KL's."""
    theta, teacher_logits = _categorical(seed)
    log_t = jax.nn.log_softmax(teacher_logits)

    def expected(kind):
        def loss(th):
            logp = jax.nn.log_softmax(th)
            per_token = losses.kl_penalty(logp[None], log_t[None], kind)[0]
            return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * per_token)  # samples from the fixed π_θ
        return jax.grad(loss)(theta)

    reverse = jax.grad(lambda th: jnp.sum(jnp.exp(jax.nn.log_softmax(th)) * (jax.nn.log_softmax(th) - log_t)))
    forward = jax.grad(lambda th: jnp.sum(jnp.exp(log_t) * (log_t - jax.nn.log_softmax(th))))
    np.testing.assert_allclose(expected("k2"), reverse(theta), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(expected("k3"), forward(theta), rtol=1e-5, atol=1e-6)
    assert not np.allclose(reverse(theta), forward(theta), atol=1e-3)  # the two targets differ here


class _Tok:
    def __init__(self, vocab: dict[str, int], eos: int = 1, pad: int = 0):
        self.vocab, self.eos_token_id, self.pad_token_id, self.bos_token_id = vocab, eos, pad, None

    def __len__(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)


def test_teacher_tokenizer_must_be_the_students():
    vocab = {"<pad>": 0, "<eos>": 1, "a": 2, "b": 3}
    check_same_tokenizer(_Tok(vocab), _Tok(dict(vocab)), 4, "t")  # same: accepted
    check_same_tokenizer(_Tok(vocab), _Tok(dict(vocab)), 8, "t")  # a padded embedding covers it
    cases = [
        (_Tok({**vocab, "c": 4}), 5, "vocab_size differ: 5 tokens vs the student's 4"),
        (_Tok({"<pad>": 0, "<eos>": 1, "a": 2, "c": 3}), 4, "vocabulary (same size, different tokens)"),
        (_Tok(vocab, eos=2), 4, "eos_token_id differ"),
        (_Tok(vocab), 3, "the teacher's embedding has 3 rows for the student's 4 tokens"),
        (None, 4, "the teacher has no saved tokenizer"),
    ]
    for teacher, rows, words in cases:
        with pytest.raises(ConfigError, match="algorithm.distill.teacher='t'") as e:
            check_same_tokenizer(teacher, _Tok(vocab), rows, "t")
        assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("layout", ["missing", "empty"])
def test_a_teacher_that_is_not_a_model_is_one_line_and_exit_2(tmp_path, capsys, layout):
    """`jaxrl train` refuses the run before building or compiling anything, and writes nothing."""
    from jaxrl.cli import main

    teacher = tmp_path / "teacher"
    if layout == "empty":
        teacher.mkdir()
    run = tmp_path / "run"
    argv = ["train", "--run-dir", str(run), "--set", f"algorithm.distill.teacher={teacher}",
            "--set", "sft_warmup.steps=0", "--set", "logging.progress_bar=false"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"algorithm.distill.teacher='{teacher}'" in err, err
    assert ("no such directory" if layout == "missing" else "cannot") in err, err
    assert not run.exists()
