"""Jitted Bradley-Terry / DIR reward-model step and the `train-rm` loop.

One RM step on a batch of B pairs (DIR, arXiv:2512.23461, spec section 5):
  1. forward chosen and rejected rows together → r^c, r^r, pooled hidden h^c, h^r; x = h^c − h^r;
  2. (debias) k AdamW steps of the CLUB classifier q_ψ(a|x) on stop_gradient(x) (`classifier_inner_steps`);
  3. L = L_BT + γ·Î_CLUB(x; a) with ψ fixed, and one optax step of the RM on ∇L.
The forward runs once: `jax.vjp` keeps the backbone's pullback while ψ is updated on the forward's x, then the
loss gradient w.r.t. (r^c, r^r, x) is pulled back through it.

With `debias.micro_batches = M > 1`, step 2 runs over the M consecutive micro-batches of B/M pairs in order
(k steps on micro-batch m give ψ_m) and step 3 uses (1/M) Σ_m Î(ψ_m; x_m) — the reference's schedule of 5
classifier steps and one CLUB estimate per gradient-accumulation micro-step.

γ here is the effective weight of Î in this global-batch objective; the reference's `debias_factor` on W GPUs
corresponds to γ = debias_factor / W (`jaxrl.losses.dir.reference_gamma`; default 0.125 = 1/8, its script).

Deviations from the reference trainer: with the default M = 1 the CLUB estimate uses the whole global batch of
B pairs (the reference gathers one pair per GPU, N = 8 per micro-step: set `data.batch_size = 8·M`); the
classifier's AdamW state lives next to the RM's in the checkpoint's `opt_state` item as {"rm", "clf",
"clf_opt"} (params of ψ included, so resume is exact).
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
from jaxrl.runtime import compile_cache

# Sharded XLA:CPU reward-model steps stay out of the persistent compilation cache (`jaxrl.runtime.compile_cache`).
compile_cache.install()


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
    """AdamW of q_ψ: torch.optim.AdamW's defaults (betas 0.9/0.999, eps 1e-8, decoupled weight decay 0.01 —
    `debias.classifier_weight_decay`) at `debias.classifier_lr`, as the reference's classifier optimiser."""
    return optax.adamw(debias.classifier_lr, b1=0.9, b2=0.999, eps=1e-8,
                       weight_decay=debias.classifier_weight_decay)


def init_classifier(debias: DebiasConfig, hidden_size: int, key: jax.Array):
    """(ψ params, optax state) of q_ψ(a|x); x has D (difference) or 2D (concat) features."""
    in_dim = hidden_size * (2 if debias.representation == "concat" else 1)
    clf = dir_lib.init_club_classifier(key, in_dim, hidden=debias.hidden_dim)
    return clf, classifier_optimizer(debias).init(clf)


def rm_objective(r_chosen_B, r_rejected_B, x_NX, a_N, clf, *, gamma, debias: bool, stacked: bool = False):
    """L = L_BT(r^c, r^r) + γ·Î_CLUB(q_ψ(·|x); a) with ψ = `clf` held fixed (plain L_BT when not `debias`).

    Args:
      r_chosen_B, r_rejected_B: float32 scores [B].
      x_NX: pair representations [N, X] (N = B in the RM step); gradients flow to x.
      a_N: int32 attributes [N]. clf: classifier params (`jaxrl.losses.dir.init_club_classifier`), or with
        `stacked` the M micro-step classifiers ψ_1..ψ_M on a leading axis (`dir.classifier_micro_steps`):
        Î is then (1/M) Σ_m Î(ψ_m; x_m, a_m) over M equal consecutive micro-batches.
    Returns:
      (loss, {"rm/bt", "dir/club_mi"}).
    """
    bt = dir_lib.bradley_terry_loss(r_chosen_B, r_rejected_B)
    if not debias:
        return bt, {"rm/bt": bt}
    if stacked:
        mi = dir_lib.club_mi_micro(clf, x_NX, a_N)
        return bt + gamma * mi, {"rm/bt": bt, "dir/club_mi": mi}
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
    clf_nll_after}` (the NLL of q_ψ before its k inner steps, averaged over the micro-batches, and of the
    final ψ on the whole batch).
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
        stacked = debias.micro_batches > 1
        clf_for_loss = clf
        if debias.enabled:
            clf_stack, clf, clf_state, nll_M = dir_lib.classifier_micro_steps(
                clf, clf_state, x_BX, batch.a_B, clf_opt, debias.inner_steps, debias.micro_batches)
            clf_for_loss = clf_stack if stacked else clf
            nll_after = dir_lib.club_classifier_nll(dir_lib.apply_club_classifier(clf, x_BX), batch.a_B)
            metrics.update({"dir/clf_nll_before": nll_M.mean(), "dir/clf_nll_after": nll_after})

        def head_loss(r_c, r_r, x_BX):
            return rm_objective(r_c, r_r, x_BX, batch.a_B, clf_for_loss, gamma=gamma, debias=debias.enabled,
                                stacked=stacked)

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
