"""The RM objective against spec section 5's worked example, the classifier inner loop, and the jitted step's
gradient (one forward + vjp) against a direct `jax.grad` of the same loss."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl.losses import dir as dir_lib
from jaxrl.models import TransformerConfig
from jaxrl.reward_model.config import DebiasConfig
from jaxrl.reward_model.model import RewardModel
from jaxrl.reward_model.train import (Batch, RMState, classifier_optimizer, init_classifier, make_train_step,
                                      rm_objective)

Q1 = np.array([0.9, 0.8, 0.3, 0.2])     # q(a=1 | x_i) of the spec example
A = np.array([1, 1, 0, 0], np.int32)
R_C, R_R = jnp.array([1.0, 0.2]), jnp.array([0.5, 0.4])


def _spec_classifier():
    # Linear q over a 1-d x: logits = [0, x], so q(a=1|x) = sigmoid(x); x_i = logit(q_i) reproduces the
    # example.
    clf = {"w_DC": jnp.array([[0.0, 1.0]]), "b_C": jnp.zeros(2)}
    x_N1 = jnp.asarray(np.log(Q1 / (1 - Q1)), jnp.float32)[:, None]
    return clf, x_N1


@pytest.mark.parametrize("gamma,total", [(0.1, 0.70882), (1.0, 1.36325)])
def test_objective_matches_spec_example(gamma, total):
    clf, x = _spec_classifier()
    loss, m = rm_objective(R_C, R_R, x, jnp.asarray(A), clf, gamma=gamma, debias=True)
    assert float(m["rm/bt"]) == pytest.approx(0.63611, abs=1e-5)
    assert float(m["dir/club_mi"]) == pytest.approx(0.72714, abs=1e-5)
    assert float(loss) == pytest.approx(total, abs=1e-5)
    nll = dir_lib.club_classifier_nll(dir_lib.apply_club_classifier(clf, x), jnp.asarray(A))
    assert float(nll) == pytest.approx(0.22708, abs=1e-5)


def test_objective_without_debias_is_plain_bt():
    clf, x = _spec_classifier()
    loss, m = rm_objective(R_C, R_R, x, jnp.asarray(A), clf, gamma=1.0, debias=False)
    want = np.mean([math.log1p(math.exp(-0.5)), math.log1p(math.exp(0.2))])
    assert float(loss) == pytest.approx(want, abs=1e-6) and set(m) == {"rm/bt"}


def test_classifier_inner_loop_lowers_nll():
    debias = DebiasConfig(enabled=True, inner_steps=5, classifier_lr=1e-2, hidden_dim=16)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 64).astype(np.int32)
    x = rng.normal(size=(64, 8)).astype(np.float32) + 1.5 * a[:, None]   # a is linearly decodable from x
    clf, state = init_classifier(debias, 8, jax.random.key(0))
    opt = classifier_optimizer(debias)
    nlls = []
    for _ in range(4):
        clf, state, before = dir_lib.classifier_inner_steps(clf, state, jnp.asarray(x), jnp.asarray(a),
                                                            opt, 5)
        nlls.append(float(before))
    logits = dir_lib.apply_club_classifier(clf, jnp.asarray(x))
    after = float(dir_lib.club_classifier_nll(logits, jnp.asarray(a)))
    assert all(b < a_ for a_, b in zip(nlls, nlls[1:])) and after < nlls[-1]
    assert after < 0.5 * nlls[0]


def _tiny_batch(seed=0):
    rng = np.random.default_rng(seed)
    chosen = rng.integers(3, 64, size=(4, 7)).astype(np.int32)
    rejected = rng.integers(3, 64, size=(4, 7)).astype(np.int32)
    chosen[0, 5:] = 0
    rejected[1, 3:] = 0
    return Batch(jnp.asarray(chosen), jnp.asarray(rejected), jnp.asarray([1, 0, 1, 0], jnp.int32))


@pytest.mark.parametrize("enabled,micro_batches", [(False, 1), (True, 1), (True, 2)])
def test_step_gradient_equals_direct_grad(enabled, micro_batches):
    """With SGD(lr=1), params_new = params − ∇L; ∇L is recomputed by jax.grad through the whole model."""
    debias = DebiasConfig(enabled=enabled, gamma=0.7, inner_steps=3, classifier_lr=1e-2, hidden_dim=8,
                          micro_batches=micro_batches)
    rm = RewardModel(TransformerConfig.tiny(), rngs=nnx.Rngs(0))
    rm.score = nnx.Param(rm.score[...] * 30)
    graphdef, params = nnx.split(rm, nnx.Param)
    params = params.to_pure_dict()
    opt = optax.sgd(1.0)
    clf, clf_opt = init_classifier(debias, 32, jax.random.key(1)) if enabled else ({}, ())
    batch = _tiny_batch()
    state = RMState(params, opt.init(params), clf, clf_opt)
    copy = jax.tree.map(jnp.array, state)
    new_state, metrics = make_train_step(graphdef, opt, debias)(state, batch, jnp.float32(0.7))

    clf_for_loss, stacked = new_state.clf, micro_batches > 1
    if stacked:  # psi_1..psi_M of the step's micro-steps, recomputed from the incoming state
        m0 = nnx.merge(graphdef, copy.params)
        x0 = m0(batch.chosen_BL)[1] - m0(batch.rejected_BL)[1]
        clf_for_loss, final, _, _ = dir_lib.classifier_micro_steps(
            copy.clf, copy.clf_opt, x0, batch.a_B, classifier_optimizer(debias), 3, micro_batches)
        for got, exp in zip(jax.tree.leaves(new_state.clf), jax.tree.leaves(final)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-5, atol=1e-6)

    def full_loss(p):
        m = nnx.merge(graphdef, p)
        r_c, h_c = m(batch.chosen_BL)
        r_r, h_r = m(batch.rejected_BL)
        return rm_objective(r_c, r_r, h_c - h_r, batch.a_B, clf_for_loss, gamma=0.7, debias=enabled,
                            stacked=stacked)[0]

    loss, grads = jax.value_and_grad(full_loss)(copy.params)
    assert float(metrics["rm/loss"]) == pytest.approx(float(loss), rel=1e-5)
    want = jax.tree.map(lambda p, g: p - g, copy.params, grads)
    for got, exp in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-5, atol=1e-6)
    if enabled:
        assert float(metrics["dir/clf_nll_after"]) < float(metrics["dir/clf_nll_before"])
        assert float(metrics["dir/club_mi"]) != 0.0
