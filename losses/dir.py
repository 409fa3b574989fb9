"""DIR: Bradley-Terry reward-model loss plus a CLUB mutual-information penalty against a bias attribute.

"Eliminating Inductive Bias in Reward Models with Information-Theoretic Guidance", arXiv:2512.23461
(reference: Qwen-Applications/DIR, ``reward_models/debias_trainer_length.py``: ``CLUBForCategorical``,
``DeBiasedRewardTrainer.train_debias_nn / global_estimate_mi / training_step``).

With x_i = h^c_i − h^r_i (pair representation), a_i ∈ {0..C−1} the bias attribute and
q_ψ(a|x) = softmax(MLP(x))::

    L_BT = −(1/B) Σ_i log σ(r^c_i − r^r_i)
    Î    = (1/N) Σ_i log q_ψ(a_i|x_i) − (1/N²) Σ_i Σ_j log q_ψ(a_j|x_i)     (CLUB; the double sum keeps i = j)
    L_ψ  = −(1/N) Σ_i log q_ψ(a_i|x_i)                                         (classifier NLL, x detached)
    L    = L_BT + γ · Î
    I_NCE = log N + (1/N) Σ_i [f_ii − log Σ_j exp f_ij] ≤ I(X; Y)             (InfoNCE lower bound, critic f)

Symbol mapping: γ = ``gamma`` is the *effective* weight of Î in the global-batch objective above. The
reference's ``debias_factor`` is not the same number: it computes Î on an all-gathered batch whose backward
keeps only the local slice (``AllGatherWithGrad``), every rank adds the full ``debias_factor``·Î to its local
BT loss, and DeepSpeed/DDP averages gradients over the W ranks, so its update is that of ``mean BT +
(debias_factor/W)·Î`` (``reference_gamma``). ``train_debias_rm.sh`` runs W = 8 GPUs with ``debias_factor=1``:
γ = 0.125, the default here (``REFERENCE_GAMMA``); the reference dataclass default 0.1 would be 0.0125 at W =
8. The classifier is Linear(d, 1024) → ReLU → Linear(1024, 2) (``debias_hidden_dim``), trained with
``debias_optim_iter`` = 5 AdamW(lr 1e-4, torch's default weight decay 0.01) steps per *micro-step*
(``classifier_inner_steps``; ``classifier_micro_steps`` runs them over the micro-batches of one RM step, as
the reference does over its 16 gradient-accumulation micro-steps of N = 8 gathered pairs each).

Deviations from the reference:
- The all-pairs term is computed in O(N·C) as Σ_c log q(c|x_i) · freq(c) with freq the attribute histogram;
  it equals the O(N²) double mean exactly in real arithmetic. With a constant attribute both terms reduce to
  identical float operations, so Î = 0 exactly.
- Functions take logits and arrays; gathering across devices (the reference's autograd all-gather) is the
  caller's job (e.g. compute under ``jax.jit`` on the globally sharded batch).
- ``infonce_mi_lower_bound`` is the standard InfoNCE bound (van den Oord et al., arXiv:1807.03748) for the
  "maximise MI with the preference" side; it is not in the DIR repository.
"""

import math
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import optax

REFERENCE_GAMMA = 0.125  # debias_factor=1 over W=8 GPUs in the reference's scripts/train_debias_rm.sh


def reference_gamma(debias_factor: float, num_workers: int) -> float:
    """γ of this module equal in effect to the reference's ``--debias_factor`` on ``num_workers`` GPUs.

    γ = debias_factor / W (module docstring: the all-gather keeps only the local slice in the backward and the
    ranks' gradients are averaged). ``reference_gamma(1.0, 8) == REFERENCE_GAMMA``.
    """
    if num_workers < 1:
        raise ValueError(f"reference_gamma: num_workers must be >= 1, got {num_workers}")
    return debias_factor / num_workers


def bradley_terry_loss(r_chosen_B: jax.Array, r_rejected_B: jax.Array) -> jax.Array:
    """L_BT = mean_i softplus(−(r^c_i − r^r_i)) = −mean log σ(r^c − r^r), in float32."""
    chex.assert_rank([r_chosen_B, r_rejected_B], 1)
    chex.assert_equal_shape([r_chosen_B, r_rejected_B])
    margin_B = r_chosen_B.astype(jnp.float32) - r_rejected_B.astype(jnp.float32)
    return jax.nn.softplus(-margin_B).mean()


def _log_q(logits_NC, a_N):
    chex.assert_rank([logits_NC, a_N], [2, 1])
    chex.assert_equal_shape_prefix([logits_NC, a_N], 1)
    logq_NC = jax.nn.log_softmax(logits_NC.astype(jnp.float32), axis=-1)
    onehot_NC = jax.nn.one_hot(a_N, logits_NC.shape[-1], dtype=jnp.float32)
    return logq_NC, onehot_NC


def club_classifier_nll(logits_NC: jax.Array, a_N: jax.Array) -> jax.Array:
    """L_ψ = −mean_i log q(a_i | x_i) from classifier logits ``[N, C]`` and integer attributes ``[N]``."""
    logq_NC, onehot_NC = _log_q(logits_NC, a_N)
    return -(logq_NC * onehot_NC).sum(-1).mean()


def club_mi(logits_NC: jax.Array, a_N: jax.Array) -> jax.Array:
    """CLUB upper bound Î = mean_i log q(a_i|x_i) − mean_{i,j} log q(a_j|x_i) (all pairs, i = j included).

    Args:
      logits_NC: classifier logits (C = 2 in DIR); gradients flow to x through them (keep ψ fixed).
      a_N: integer attribute in ``[0, C)``.
    Returns:
      scalar float32; may be negative when q is poorly fit (not clipped, as in the reference).
    """
    logq_NC, onehot_NC = _log_q(logits_NC, a_N)
    freq_1C = onehot_NC.mean(0, keepdims=True)
    positive = (logq_NC * onehot_NC).sum(-1).mean()
    all_pairs = (logq_NC * freq_1C).sum(-1).mean()
    return positive - all_pairs


def dir_loss(
    r_chosen_B: jax.Array,
    r_rejected_B: jax.Array,
    logits_NC: jax.Array,
    a_N: jax.Array,
    *,
    gamma: float = REFERENCE_GAMMA,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L = L_BT + γ · Î; returns ``(loss, metrics)`` with ``dir/{bt,club_mi,loss,rm_acc}``.

    γ is the effective weight (module docstring); default 0.125, the reference script's effective value.
    """
    bt = bradley_terry_loss(r_chosen_B, r_rejected_B)
    mi = club_mi(logits_NC, a_N)
    loss = bt + gamma * mi
    acc = (r_chosen_B > r_rejected_B).astype(jnp.float32).mean()
    return loss, {"dir/bt": bt, "dir/club_mi": mi, "dir/loss": loss, "dir/rm_acc": acc}


def infonce_mi_lower_bound(scores_NN: jax.Array) -> jax.Array:
    """I_NCE = log N + mean_i [f_ii − logsumexp_j f_ij], critic scores f_ij = f(x_i, y_j).

    Positives sit on the diagonal.

    Maximise it to *increase* MI between representations and the preference; it never exceeds log N.
    """
    chex.assert_rank(scores_NN, 2)
    chex.assert_axis_dimension(scores_NN, 1, scores_NN.shape[0])
    f_NN = scores_NN.astype(jnp.float32)
    n = f_NN.shape[0]
    return math.log(n) + (jnp.diagonal(f_NN) - jax.nn.logsumexp(f_NN, axis=-1)).mean()


def length_attribute(len_chosen_B: jax.Array, len_rejected_B: jax.Array) -> jax.Array:
    """a = 1[len(chosen) > len(rejected)] as int32 (ties → 0, as in the reference)."""
    chex.assert_equal_shape([len_chosen_B, len_rejected_B])
    return (len_chosen_B > len_rejected_B).astype(jnp.int32)


def pair_representation(
    h_chosen_BD: jax.Array, h_rejected_BD: jax.Array, mode: str = "difference"
) -> jax.Array:
    """x = h^c − h^r ("difference", default) or [h^c ; h^r] ("concat")."""
    chex.assert_rank([h_chosen_BD, h_rejected_BD], 2)
    chex.assert_equal_shape([h_chosen_BD, h_rejected_BD])
    if mode == "difference":
        return h_chosen_BD - h_rejected_BD
    if mode == "concat":
        return jnp.concatenate([h_chosen_BD, h_rejected_BD], axis=-1)
    raise ValueError(f"pair_representation mode={mode!r}; allowed: 'difference', 'concat'")


def init_club_classifier(
    key: jax.Array, in_dim: int, *, hidden: int | None = 1024, num_classes: int = 2
) -> dict[str, jax.Array]:
    """Classifier params (torch ``nn.Linear`` init).

    MLP: ``{w1_DF, b1_F, w2_FC, b2_C}``; linear (``hidden=None``): ``{w_DC, b_C}``.
    """
    if in_dim <= 0 or num_classes < 2 or (hidden is not None and hidden <= 0):
        raise ValueError(f"init_club_classifier: in_dim={in_dim}, hidden={hidden}, "
                         f"num_classes={num_classes}; "
                         "need in_dim > 0, hidden > 0 or None, num_classes >= 2")

    def linear(k, fan_in, fan_out):
        kw, kb = jax.random.split(k)
        bound = 1.0 / math.sqrt(fan_in)
        w = jax.random.uniform(kw, (fan_in, fan_out), jnp.float32, -bound, bound)
        return w, jax.random.uniform(kb, (fan_out,), jnp.float32, -bound, bound)

    if hidden is None:
        w, b = linear(key, in_dim, num_classes)
        return {"w_DC": w, "b_C": b}
    k1, k2 = jax.random.split(key)
    w1, b1 = linear(k1, in_dim, hidden)
    w2, b2 = linear(k2, hidden, num_classes)
    return {"w1_DF": w1, "b1_F": b1, "w2_FC": w2, "b2_C": b2}


def apply_club_classifier(params: dict[str, jax.Array], x_ND: jax.Array) -> jax.Array:
    """Logits ``[N, C]`` of q_ψ(a|x) in float32."""
    chex.assert_rank(x_ND, 2)
    x_ND = x_ND.astype(jnp.float32)
    if "w_DC" in params:
        return x_ND @ params["w_DC"] + params["b_C"]
    return jax.nn.relu(x_ND @ params["w1_DF"] + params["b1_F"]) @ params["w2_FC"] + params["b2_C"]


def classifier_inner_steps(
    params: dict[str, jax.Array],
    opt_state: optax.OptState,
    x_detached_ND: jax.Array,
    a_N: jax.Array,
    optimizer: optax.GradientTransformation,
    k: int,
    apply_fn: Callable[[dict[str, jax.Array], jax.Array], jax.Array] = apply_club_classifier,
) -> tuple[dict[str, jax.Array], optax.OptState, jax.Array]:
    """Run k optax steps on L_ψ with x detached (``lax.fori_loop``); returns (params, opt_state, nll_before).

    ``nll_before`` is the NLL at the incoming params, for logging. Jit-able with ``optimizer``, ``k`` and
    ``apply_fn`` static.
    """
    x_ND = jax.lax.stop_gradient(x_detached_ND)

    def nll(p):
        return club_classifier_nll(apply_fn(p, x_ND), a_N)

    def body(_, carry):
        p, s = carry
        grads = jax.grad(nll)(p)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    nll_before = nll(params)
    params, opt_state = jax.lax.fori_loop(0, k, body, (params, opt_state))
    return params, opt_state, nll_before


def classifier_micro_steps(
    params: dict[str, jax.Array],
    opt_state: optax.OptState,
    x_detached_ND: jax.Array,
    a_N: jax.Array,
    optimizer: optax.GradientTransformation,
    k: int,
    micro_batches: int,
    apply_fn: Callable[[dict[str, jax.Array], jax.Array], jax.Array] = apply_club_classifier,
) -> tuple[dict[str, jax.Array], dict[str, jax.Array], optax.OptState, jax.Array]:
    """The reference's ψ schedule over one RM step: for each of M micro-batches in order, k steps on it.

    The N rows are split into M = ``micro_batches`` consecutive equal micro-batches (the reference's
    gradient-accumulation micro-steps); ψ_m is ψ after the k steps on micro-batch m (``lax.scan``).

    Returns:
      (ψ_1..ψ_M stacked on a leading axis (for ``club_mi_micro``), ψ_M, its optimiser state,
       [M] NLL of each micro-batch before its steps).
    """
    n = x_detached_ND.shape[0]
    if micro_batches < 1 or n % micro_batches:
        raise ValueError(f"classifier_micro_steps: {n} rows do not split into micro_batches={micro_batches}")
    x_MND = jax.lax.stop_gradient(x_detached_ND).reshape(micro_batches, n // micro_batches, -1)
    a_MN = a_N.reshape(micro_batches, n // micro_batches)

    def body(carry, xs):
        p, s, nll = classifier_inner_steps(*carry, *xs, optimizer, k, apply_fn)
        return (p, s), (p, nll)

    (params, opt_state), (stacked, nll_M) = jax.lax.scan(body, (params, opt_state), (x_MND, a_MN))
    return stacked, params, opt_state, nll_M


def club_mi_micro(
    stacked_params: dict[str, jax.Array],
    x_ND: jax.Array,
    a_N: jax.Array,
    apply_fn: Callable[[dict[str, jax.Array], jax.Array], jax.Array] = apply_club_classifier,
) -> jax.Array:
    """(1/M) Σ_m Î(ψ_m; x_m, a_m): the CLUB estimate of each micro-batch with its own ψ_m, averaged (the
    reference's per-micro-step estimates under gradient accumulation). Gradients flow to x; ψ is held fixed.

    Args:
      stacked_params: ψ_1..ψ_M on a leading axis (``classifier_micro_steps``); M divides N.
      x_ND: [N, D] pair representations.  a_N: [N] int attributes.
    """
    m = jax.tree.leaves(stacked_params)[0].shape[0]
    n = x_ND.shape[0]
    if n % m:
        raise ValueError(f"club_mi_micro: {n} rows do not split into {m} micro-batches")
    x_MND = x_ND.reshape(m, n // m, -1)
    a_MN = a_N.reshape(m, n // m)
    per_micro = lambda p, x, a: club_mi(apply_fn(p, x), a)
    mi_M = jax.vmap(per_micro)(jax.lax.stop_gradient(stacked_params), x_MND, a_MN)
    return mi_M.mean()
