"""CLIPO's contrastive head as a reward-shaping stage (arXiv:2603.10101; reference Qwen-Applications/CLIPO,
`verl/trainer/ppo/ray_trainer.py::compute_contrastive_rewards`).

Each step: mean-pool the policy's final hidden states over the completion (teacher-forced, detached), compute
the per-anchor contrastive loss of the correct rollouts *before* the head's AdamW step, turn it into a
non-positive reward bonus (`losses.contrastive_bonus`), then update the head. A rollout is correct when its
total task score is > 0 (the reference's `correctness_mask = reward_tensor.sum(-1) > 0`), not when its first
reward column is. During `algorithm.params.warmup_steps` only the head trains (the reference's
`critic_warmup`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl import losses
from jaxrl._checks import check as _check
from jaxrl.algorithms.base import AlgoSettings, task_reward
from jaxrl.errors import CheckpointError
from jaxrl.sharding import hosts


@dataclasses.dataclass(frozen=True)
class CLIPOParams:
    """`algorithm.params` of clipo: temperature τ, bonus scale λ (`lam`), head width (reference scripts: 512
    GSM8K, 2048 MATH), head AdamW lr, and RL steps during which only the head trains."""

    tau: float = 0.05
    lam: float = 0.2
    head_dim: int = 512
    lr: float = 1e-3
    warmup_steps: int = 0

    def __post_init__(self):
        _check(self.tau > 0, "algorithm.params.tau", self.tau, "must be > 0")
        _check(self.lr > 0, "algorithm.params.lr", self.lr, "must be > 0")
        _check(self.lam >= 0, "algorithm.params.lam", self.lam, "must be >= 0")
        _check(self.head_dim >= 1, "algorithm.params.head_dim", self.head_dim, "must be >= 1")
        _check(self.warmup_steps >= 0, "algorithm.params.warmup_steps", self.warmup_steps, "must be >= 0")


class ClipoHead:
    """The head's parameters, its own AdamW state, and the jitted pooling and head step."""

    name = "clipo_bonus"

    def __init__(self, graphdef, mesh, hidden_dim: int, seed: int, s: AlgoSettings):
        c = s.params
        self.settings, self.warmup_steps = s, c.warmup_steps
        self.cfg = losses.ContrastiveHeadConfig(in_dim=hidden_dim, out_dim=c.head_dim)
        # Committed and replicated from the start: the jitted head step returns committed arrays, and an
        # uncommitted first input would make its second call compile again.
        rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.params = hosts.place_global(losses.init_contrastive_head(self.cfg, jax.random.key(seed + 1)), rep)
        self.tx = optax.adamw(c.lr, weight_decay=0.01)
        self.opt_state = hosts.place_global(self.tx.init(self.params), rep)
        g, tau, lam = s.group_size, c.tau, c.lam

        def step(head, opt_state, h_BD, correct_B, key):
            z_BC = losses.apply_contrastive_head(head, h_BD)
            _, per_anchor_B, anchor_B = losses.contrastive_loss(z_BC, correct_B, g, tau=tau, key=key)
            bonus_B = losses.contrastive_bonus(per_anchor_B, correct_B, anchor_B, lam=lam)
            (_, metrics), grads = jax.value_and_grad(losses.clipo_head_loss, has_aux=True)(
                head, h_BD, correct_B, g, tau=tau, key=key)
            updates, opt_state = self.tx.update(grads, opt_state, head)
            return optax.apply_updates(head, updates), opt_state, bonus_B, metrics

        def pooled(params, tokens_BL, mask_BL, completion_mask_BT):
            out = nnx.merge(graphdef, params).forward(tokens_BL, None, mask_BL, return_hidden=True,
                                                      return_logits=False)
            t = completion_mask_BT.shape[1]
            return losses.mean_pool(jax.lax.stop_gradient(out.hidden[:, -t:]), completion_mask_BT)

        self._step = jax.jit(step)
        self._pooled = jax.jit(pooled)

    def __call__(self, params, ro, key) -> tuple[np.ndarray, dict[str, float]]:
        h_BD = self._pooled(params, ro.tokens_BL, ro.mask_BL, ro.completion_mask_BT)
        correct_B = jnp.asarray(task_reward(ro.rewards_BR, ro.weights_R, self.settings) > 0)
        self.params, self.opt_state, bonus_B, metrics = self._step(self.params, self.opt_state, h_BD,
                                                                   correct_B, key)
        out = {k: float(v) for k, v in metrics.items()}
        out["clipo/bonus_mean"] = float(jnp.mean(bonus_B))
        return hosts.to_host(bonus_B).astype(np.float32), out  # every host's rows

    def actor_frozen(self, step: int) -> bool:
        return step < self.warmup_steps

    def state_json(self) -> list:
        """Head parameters and optimiser state as JSON lists (float32 values round-trip exactly)."""
        # to_host: a replicated head may still span other processes' devices, which np.asarray refuses
        return [hosts.to_host(x).tolist() for x in jax.tree.leaves((self.params, self.opt_state))]

    def load_state(self, data: list) -> None:
        """Inverse of `state_json` (shapes, dtypes and shardings from the freshly initialised head)."""
        leaves, treedef = jax.tree.flatten((self.params, self.opt_state))
        if len(data) != len(leaves):
            raise CheckpointError(f"CLIPO head state has {len(data)} arrays, expected {len(leaves)}")
        new = [jax.device_put(np.asarray(d, x.dtype).reshape(x.shape), x.sharding)
               for d, x in zip(data, leaves)]
        self.params, self.opt_state = jax.tree.unflatten(treedef, new)


def clipo_head(run, s: AlgoSettings) -> ClipoHead:
    """Shaper factory of the `clipo` record."""
    return ClipoHead(run.graphdef, run.mesh, run.hidden_dim, run.seed, s)
