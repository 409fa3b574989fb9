"""CLIPO: a contrastive head over rollout embeddings whose per-sample loss becomes a reward bonus.

Cui et al., "Contrastive Learning in Policy Optimization", arXiv:2603.10101
(reference: Qwen-Applications/CLIPO, ``verl/trainer/ppo/ray_trainer.py``: ``ContrastiveHead``,
``supcon_loss``, ``RayPPOTrainer.compute_contrastive_rewards``).

Per anchor i with head outputs z (L2-normalised) and correctness y ∈ {0, 1}::

    s_ij = z_i · z_j            ("l2" distance: 1 − sqrt(max(2 − 2 s_ij, 1e-8)))
    ℓ_ij = s_ij / τ − max_k s_ik / τ                 (row max incl. self; stability only, in float32)
    P(i) = {j ≠ i : y_j = y_i, same group}           (level "batch": same label anywhere in the batch)
    A(i) = {a ≠ i : same group}                      (levels "batch" and "cross": the whole batch)
    InfoNCE    L_i = −[ℓ_ip − log(Σ_{a∈A(i)} e^{ℓ_ia} + ε)],  p ~ Uniform(P(i))
    SupCon-out L_i = −(1/|P(i)|) Σ_{p∈P(i)} [ℓ_ip − log(Σ_a e^{ℓ_ia} + ε)]
    SupCon-in  L_i = −[log(Σ_p e^{ℓ_ip} + ε) − log(Σ_a e^{ℓ_ia} + ε) − log(|P(i)| + ε)]
    soft-NN    L_i = −[log(Σ_p e^{ℓ_ip} + ε) − log(Σ_a e^{ℓ_ia} + ε)]
    anchor_i   = 1[y_i ≠ masked_label] · 1[|P(i)| > 0 ∧ |A(i) \\ P(i)| > 0]   (2nd factor if skip_trivial)
    L_head     = Σ_i anchor_i L_i / (Σ_i anchor_i + ε)
    r^con_i    = max(c0 − λ · anchor_i · L_i · y_i, floor)

Symbol mapping: τ = ``tau`` (``con_lm_head_temperature``, 0.05), λ = ``lam`` (``con_lm_head_lambda``, 0.2),
c0 = ``c0`` (``con_lm_head_contant_reward``, 0), floor = −0.5 (hard-coded clamp in the reference), ε = 1e-8.

Deviations from the reference:
- Groups are contiguous blocks of ``group_size`` rows (the reference compares ``uid`` strings).
- The InfoNCE positive is drawn with ``jax.random.categorical`` from an explicit key (the reference uses
  ``torch.multinomial``, unseeded), so the loss is reproducible.
- The embedding is the masked mean over generated tokens of the final normed hidden state (``mean_pool``);
  the reference's SGLang patch sums N−1 decode states and divides by N.
- No printing; when no anchor survives the per-anchor losses and the head loss are exactly zero, as in the
  reference, and gradients are zeros (not NaN).
- The head is a plain parameter pytree (``init_contrastive_head`` / ``apply_contrastive_head``) so the trainer
  can update it with its own optax state in a pure function.
"""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp

_KINDS = ("infonce", "supcon_out", "supcon_in", "soft_nn")
_LEVELS = ("group", "batch", "cross")
_DISTANCES = ("cosine", "l2")
_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class ContrastiveHeadConfig:
    """Sizes of the contrastive head: ``linear`` (z = normalize(W h)) or ``mlp`` (Linear-ReLU-Linear)."""

    in_dim: int
    out_dim: int = 512
    kind: str = "linear"

    def __post_init__(self):
        if self.kind not in ("linear", "mlp"):
            raise ValueError(f"ContrastiveHeadConfig.kind={self.kind!r}; allowed: 'linear', 'mlp'")
        if self.in_dim <= 0 or self.out_dim <= 0:
            raise ValueError(f"ContrastiveHeadConfig dims must be > 0, got in_dim={self.in_dim}, "
                             f"out_dim={self.out_dim}")


def _uniform(key, shape, fan_in):
    bound = 1.0 / math.sqrt(fan_in)  # torch nn.Linear default (kaiming_uniform with a=sqrt(5))
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def init_contrastive_head(cfg: ContrastiveHeadConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Bias-free head parameters: ``{"proj_DC"}`` (linear) or ``{"fc1_DD", "fc2_DC"}`` (mlp)."""
    d, c = cfg.in_dim, cfg.out_dim
    if cfg.kind == "linear":
        return {"proj_DC": _uniform(key, (d, c), d)}
    k1, k2 = jax.random.split(key)
    return {"fc1_DD": _uniform(k1, (d, d), d), "fc2_DC": _uniform(k2, (d, c), d)}


def apply_contrastive_head(params: dict[str, jax.Array], h_BD: jax.Array) -> jax.Array:
    """z_BC = normalize(head(h_BD)) in float32; the norm is floored at 1e-12 like ``F.normalize``."""
    chex.assert_rank(h_BD, 2)
    h_BD = h_BD.astype(jnp.float32)
    if "proj_DC" in params:
        out_BC = h_BD @ params["proj_DC"]
    elif "fc1_DD" in params and "fc2_DC" in params:
        out_BC = jax.nn.relu(h_BD @ params["fc1_DD"]) @ params["fc2_DC"]
    else:
        raise ValueError(f"contrastive head params have keys {sorted(params)}; expected ['proj_DC'] or "
                         "['fc1_DD', 'fc2_DC']")
    norm_B1 = jnp.linalg.norm(out_BC, axis=-1, keepdims=True)
    return out_BC / jnp.maximum(norm_B1, 1e-12)


def mean_pool(hidden_BTD: jax.Array, mask_BT: jax.Array) -> jax.Array:
    """h_BD = Σ_t m_bt H_btD / max(Σ_t m_bt, 1) in float32; fully masked rows give zeros."""
    chex.assert_rank([hidden_BTD, mask_BT], [3, 2])
    chex.assert_equal_shape_prefix([hidden_BTD, mask_BT], 2)
    m_BT = mask_BT.astype(jnp.float32)
    total_BD = jnp.einsum("BTD,BT->BD", hidden_BTD.astype(jnp.float32), m_BT)
    return total_BD / jnp.maximum(m_BT.sum(-1), 1.0)[:, None]


def _pair_masks(y_B, group_size, level):
    b = y_B.shape[0]
    gid_B = jnp.arange(b) // group_size
    same_group_BB = gid_B[:, None] == gid_B[None, :]
    same_label_BB = y_B[:, None] == y_B[None, :]
    if level == "batch":
        return same_label_BB, jnp.ones((b, b), bool)
    if level == "group":
        return same_label_BB & same_group_BB, same_group_BB
    return same_label_BB & same_group_BB, jnp.ones((b, b), bool)


def contrastive_loss(
    z_BD: jax.Array,
    correct_B: jax.Array,
    group_size: int,
    *,
    tau: float = 0.05,
    kind: str = "infonce",
    key: jax.Array | None = None,
    masked_label: int = 0,
    skip_trivial: bool = True,
    level: str = "group",
    distance: str = "cosine",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """CLIPO head loss over L2-normalised embeddings (see the module docstring for the equations).

    Args:
      z_BD: head outputs, already L2-normalised, any float dtype (computed in float32).
      correct_B: correctness labels y (bool or 0/1 ints); rows of one group are contiguous.
      group_size: G; B must be a multiple of it.
      tau: temperature τ. kind: "infonce" | "supcon_out" | "supcon_in" | "soft_nn".
      key: PRNG key, required for "infonce" (positive sampling).
      masked_label: label whose anchors are excluded (0: only correct anchors; -1: none excluded).
      skip_trivial: drop anchors with no positive or no negative.
      level: "group" | "batch" | "cross" (positives from the group, negatives from the batch).
      distance: "cosine" | "l2".

    Returns:
      (head_loss scalar, per_anchor_loss_B float32 with zeros off-anchor, anchor_mask_B bool).
    """
    if kind not in _KINDS:
        raise ValueError(f"contrastive_loss kind={kind!r}; allowed: {_KINDS}")
    if level not in _LEVELS:
        raise ValueError(f"contrastive_loss level={level!r}; allowed: {_LEVELS}")
    if distance not in _DISTANCES:
        raise ValueError(f"contrastive_loss distance={distance!r}; allowed: {_DISTANCES}")
    if kind == "infonce" and key is None:
        raise ValueError("contrastive_loss kind='infonce' needs key= (a PRNG key to sample positives)")
    chex.assert_rank([z_BD, correct_B], [2, 1])
    chex.assert_equal_shape_prefix([z_BD, correct_B], 1)
    b = z_BD.shape[0]
    if group_size <= 0 or b % group_size:
        raise ValueError(f"contrastive_loss: batch {b} is not a multiple of group_size={group_size}")

    z_BD = z_BD.astype(jnp.float32)
    y_B = correct_B.astype(jnp.int32)
    sim_BB = z_BD @ z_BD.T
    if distance == "l2":
        sim_BB = 1.0 - jnp.sqrt(jnp.maximum(2.0 - 2.0 * sim_BB, _EPS))
    same_BB, all_BB = _pair_masks(y_B, group_size, level)
    not_self_BB = ~jnp.eye(b, dtype=bool)
    pos_BB, others_BB = same_BB & not_self_BB, all_BB & not_self_BB
    n_pos_B = pos_BB.sum(-1)
    n_neg_B = (all_BB & ~same_BB).sum(-1)

    logits_BB = sim_BB / tau
    logits_BB = logits_BB - jax.lax.stop_gradient(logits_BB.max(-1, keepdims=True))
    exp_BB = jnp.exp(logits_BB) * others_BB
    log_all_B = jnp.log(exp_BB.sum(-1) + _EPS)
    log_pos_B = jnp.log((exp_BB * pos_BB).sum(-1) + _EPS)

    if kind == "infonce":
        choice_BB = jnp.where(pos_BB, 0.0, -jnp.inf)
        choice_BB = jnp.where(n_pos_B[:, None] > 0, choice_BB, 0.0)  # rows without positives: any index
        pick_B = jax.random.categorical(key, choice_BB, axis=-1)
        picked_BB = jax.nn.one_hot(pick_B, b, dtype=jnp.float32) * pos_BB
        loss_B = -((logits_BB * picked_BB).sum(-1) - log_all_B)
    elif kind == "supcon_out":
        log_prob_BB = (logits_BB - log_all_B[:, None]) * pos_BB
        loss_B = -log_prob_BB.sum(-1) / (n_pos_B + _EPS)
    elif kind == "supcon_in":
        loss_B = -(log_pos_B - log_all_B - jnp.log(n_pos_B + _EPS))
    else:
        loss_B = -(log_pos_B - log_all_B)

    anchor_B = jnp.ones((b,), bool) if masked_label == -1 else y_B != masked_label
    if skip_trivial:
        anchor_B = anchor_B & (n_pos_B > 0) & (n_neg_B > 0)
    per_anchor_B = jnp.where(anchor_B, loss_B, 0.0)
    head_loss = per_anchor_B.sum() / (anchor_B.sum() + _EPS)
    return head_loss, per_anchor_B, anchor_B


def contrastive_bonus(
    per_anchor_loss_B: jax.Array,
    correct_B: jax.Array,
    anchor_mask_B: jax.Array,
    *,
    lam: float = 0.2,
    c0: float = 0.0,
    floor: float = -0.5,
) -> jax.Array:
    """r^con_B = max(c0 − λ · anchor · L · y, floor); added to the outcome reward before the advantage.

    Pass the per-anchor losses of the forward pass *before* the head's optimiser step (reference order).
    """
    chex.assert_rank([per_anchor_loss_B, correct_B, anchor_mask_B], 1)
    chex.assert_equal_shape([per_anchor_loss_B, correct_B, anchor_mask_B])
    loss_B = jnp.where(anchor_mask_B.astype(bool), per_anchor_loss_B.astype(jnp.float32), 0.0)
    return jnp.maximum(c0 - lam * loss_B * correct_B.astype(jnp.float32), floor)


def clipo_head_loss(
    params: dict[str, jax.Array], h_BD: jax.Array, correct_B: jax.Array, group_size: int, **loss_kwargs
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Head loss as a function of head params, for ``jax.grad``; h_BD is detached (the LLM gets no gradient).

    Returns ``(head_loss, metrics)`` with scalar metrics ``clipo/head_loss`` and ``clipo/num_anchors``; call
    ``contrastive_loss`` directly for the per-sample losses that feed ``contrastive_bonus``.
    """
    z_BC = apply_contrastive_head(params, jax.lax.stop_gradient(h_BD))
    head_loss, _, anchor_B = contrastive_loss(z_BC, correct_B, group_size, **loss_kwargs)
    return head_loss, {"clipo/head_loss": head_loss, "clipo/num_anchors": anchor_B.sum().astype(jnp.float32)}
