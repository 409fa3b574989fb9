"""Jitted Bradley-Terry / DIR reward-model step and the `train-rm` loop.

One RM step on a batch of B pairs (DIR, arXiv:2512.23461, spec section 5):
  1. forward chosen and rejected rows together → r^c, r^r, pooled hidden h^c, h^r; x = h^c − h^r;
  2. (debias) k AdamW steps of the CLUB classifier q_ψ(a|x) on stop_gradient(x) (`classifier_inner_steps`);
  3. L = L_BT + γ·Î_CLUB(x; a) with ψ fixed, and one optax step of the RM on ∇L.
The forward runs once: `jax.vjp` keeps the backbone's pullback while ψ is updated on the forward's x, then the
loss gradient w.r.t. (r^c, r^r, x) is pulled back through it.

Deviations from the reference trainer: the CLUB estimate uses the whole global batch of B pairs (the reference
gathers one pair per GPU, N = 8); the classifier's AdamW state lives next to the RM's in the checkpoint's
`opt_state` item as {"rm", "clf", "clf_opt"} (params of ψ included, so resume is exact).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl.losses import dir as dir_lib
from jaxrl.reward_model.config import DebiasConfig


class RMState(NamedTuple):
    params: Any          # nnx.State of the RewardModel's Params
    opt_state: Any       # optax state of the RM optimiser
    clf: Any             # CLUB classifier params (dict), or {} without debiasing
    clf_opt: Any         # its optax state, or ()


class Batch(NamedTuple):
    chosen_BL: jax.Array
    rejected_BL: jax.Array
    a_B: jax.Array       # int32 bias attribute of each pair


def classifier_optimizer(debias: DebiasConfig) -> optax.GradientTransformation:
    return optax.adamw(debias.classifier_lr, weight_decay=0.0)


def init_classifier(debias: DebiasConfig, hidden_size: int, key: jax.Array):
    """(ψ params, optax state) of q_ψ(a|x); x has D (difference) or 2D (concat) features."""
    in_dim = hidden_size * (2 if debias.representation == "concat" else 1)
    clf = dir_lib.init_club_classifier(key, in_dim, hidden=debias.hidden_dim)
    return clf, classifier_optimizer(debias).init(clf)


def rm_objective(r_chosen_B, r_rejected_B, x_NX, a_N, clf, *, gamma, debias: bool):
    """L = L_BT(r^c, r^r) + γ·Î_CLUB(q_ψ(·|x); a) with ψ = `clf` held fixed (plain L_BT when not `debias`).

    Args:
      r_chosen_B, r_rejected_B: float32 scores [B].
      x_NX: pair representations [N, X] (N = B in the RM step); gradients flow to x.
      a_N: int32 attributes [N]. clf: classifier params (`jaxrl.losses.dir.init_club_classifier`).
    Returns:
      (loss, {"rm/bt", "dir/club_mi"}).
    """
    bt = dir_lib.bradley_terry_loss(r_chosen_B, r_rejected_B)
    if not debias:
        return bt, {"rm/bt": bt}
    logits_NC = dir_lib.apply_club_classifier(jax.lax.stop_gradient(clf), x_NX)
    loss, m = dir_lib.dir_loss(r_chosen_B, r_rejected_B, logits_NC, a_N, gamma=gamma)
    return loss, {"rm/bt": m["dir/bt"], "dir/club_mi": m["dir/club_mi"]}


def debias_gamma(debias: DebiasConfig, step: int) -> float:
    """γ at RM step `step` (0-based): 0 while step < warmup_steps (the classifier still trains), then γ."""
    return debias.gamma if debias.enabled and step >= debias.warmup_steps else 0.0


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, debias: DebiasConfig):
    """`step(state, batch, gamma) -> (state, metrics)`, jitted with the state donated.

    `gamma` is a traced scalar (γ of this step: 0 during `debias.warmup_steps`, see `debias_gamma`), so
    switching
    DIR on does not recompile.

    Metrics: `rm/{loss,bt,acc,margin_mean,grad_norm}` and, with debiasing, `dir/{club_mi,clf_nll_before,
    clf_nll_after}` (the NLL of q_ψ before and after its k inner steps on this batch).
    """
    clf_opt = classifier_optimizer(debias)

    def step(state: RMState, batch: Batch, gamma: jax.Array):
        chex.assert_equal_shape([batch.chosen_BL, batch.rejected_BL])
        n = batch.chosen_BL.shape[0]

        def outputs(params):
            model = nnx.merge(graphdef, params)
            r_2B, h_2BD = model(jnp.concatenate([batch.chosen_BL, batch.rejected_BL], axis=0))
            x_BX = dir_lib.pair_representation(h_2BD[:n], h_2BD[n:], debias.representation)
            return r_2B[:n], r_2B[n:], x_BX.astype(jnp.float32)

        (r_c, r_r, x_BX), pullback = jax.vjp(outputs, state.params)
        metrics = {}
        clf, clf_state = state.clf, state.clf_opt
        if debias.enabled:
            clf, clf_state, nll_before = dir_lib.classifier_inner_steps(
                clf, clf_state, x_BX, batch.a_B, clf_opt, debias.inner_steps)
            nll_after = dir_lib.club_classifier_nll(dir_lib.apply_club_classifier(clf, x_BX), batch.a_B)
            metrics.update({"dir/clf_nll_before": nll_before, "dir/clf_nll_after": nll_after})

        def head_loss(r_c, r_r, x_BX):
            return rm_objective(r_c, r_r, x_BX, batch.a_B, clf, gamma=gamma, debias=debias.enabled)

        (loss, loss_metrics), cotangents = jax.value_and_grad(head_loss, argnums=(0, 1, 2), has_aux=True)(
            r_c, r_r, x_BX)
        (grads,) = pullback(cotangents)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        margin = r_c - r_r
        metrics.update(loss_metrics)
        metrics.update({"rm/loss": loss, "rm/acc": (margin > 0).astype(jnp.float32).mean(),
                        "rm/margin_mean": margin.mean(), "rm/grad_norm": optax.global_norm(grads)})
        return RMState(params, opt_state, clf, clf_state), metrics

    return jax.jit(step, donate_argnums=(0,))
