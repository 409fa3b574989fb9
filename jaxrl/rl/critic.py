"""PPO's critic (`algorithm.name: ppo`): a value model next to the policy, GAE advantages from its values, and
its own update.

    V_BT  = w · h(x)[W − 1 + t]                         the value of the state before completion token t
    A, R  = GAE_γλ(r_BT, V_BT, m_BT)                    `losses.gae_advantages` (r: the reward at the last token)
    A     ← whiten_m(A)                                 over the batch's trained tokens (`algorithm.ppo.whiten`)
    L_V   = ½ agg_m(max((V − R)², (clip(V, V_old ± c) − R)²))       `losses.value_loss`

(Schulman et al., "High-Dimensional Continuous Control Using GAE", arXiv:1506.02438, and "Proximal Policy
Optimization Algorithms", arXiv:1707.06347; reference: verl `compute_gae_advantage_return`,
`compute_value_loss` and `dp_critic`.) The value model is a `jaxrl.reward_model.RewardModel` (the trunk and a
[D, 1] head, no LM head) read at every completion position: the hidden states W − 1 .. L − 2 that the
policy's log-probs read (verl's critic: a one-label token-classification head, values[:, -T-1:-1]). It
starts from the model RL starts from, after the SFT warm start, with a fresh head (`critic_init: policy`), or
from a model or reward model at a path (`jaxrl.rl.setup`), and it trains with its own AdamW, the run's PPO
epochs x mini-batches x micro-batches (its own row order) and the value clip; its parameters and optimiser
state are checkpointed with the policy's (the checkpoint's `critic` item), so a resumed run continues exactly.

`ActorCritic` is the `UpdateSchedule` of an algorithm with a critic (`Algorithm.critic`): the estimator gives
the per-token rewards (`estimators.outcome_rewards`), the critic's values turn them into advantages, the inner
schedule updates the policy with them (not during the critic's warm-up), and the critic takes its steps on
the same rows with the values it gave as V_old (verl's order: critic, then actor; neither reads the other's
update, so the order does not change a number).

Choices: the critic runs its own forward (no shared-prompt groups); a KL penalty in the reward arrives at the
last token (the row's summed KL, as for REINFORCE++), where verl puts −β·kl_t on each token t.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl import losses
from jaxrl.rl.batch import minibatch_rows, minibatch_steps, shard_batch
from jaxrl.rl.update import Updated
from jaxrl.runtime import step_time
from jaxrl.sharding import hosts
from jaxrl.train_step import TrainState, accumulate, apply_if_finite


@flax.struct.dataclass
class ValueBatch:
    """The critic's mini-batch: the rows' tokens, the trained completion tokens, V_old and the returns R."""

    tokens_BL: jax.Array
    mask_BL: jax.Array
    completion_mask_BT: jax.Array
    old_values_BT: jax.Array
    returns_BT: jax.Array


@dataclasses.dataclass(frozen=True)
class CriticSpec:
    """The critic's static settings (`algorithm.ppo`, the run's aggregation and micro-batches)."""

    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float | None = 0.5
    whiten: bool = True
    warmup_steps: int = 0
    agg: losses.AggMode = losses.AggMode.TOKEN_MEAN
    grad_accum: int = 1


def token_values_BT(model, tokens_BL: jax.Array, mask_BL: jax.Array, width: int) -> jax.Array:
    """V_BT (float32): the value head on the hidden states that predict the last `width` tokens of each row."""
    length = tokens_BL.shape[1]
    out = model.backbone.forward(tokens_BL, None, mask_BL, return_hidden=True, return_logits=False)
    hidden_BTD = out.hidden[:, length - width - 1:length - 1]
    w_D1 = model.score[...].astype(hidden_BTD.dtype)
    return jnp.einsum("BTD,DO->BTO", hidden_BTD, w_D1, preferred_element_type=jnp.float32)[..., 0]


def _value_loss(params, graphdef, batch: ValueBatch, spec: CriticSpec, norm):
    values_BT = token_values_BT(nnx.merge(graphdef, params), batch.tokens_BL, batch.mask_BL,
                                batch.completion_mask_BT.shape[1])
    loss, metrics = losses.value_loss(values_BT, batch.old_values_BT, batch.returns_BT, batch.completion_mask_BT,
                                      clip=spec.value_clip, agg=spec.agg, normalizer=norm)
    return loss, {**metrics, "critic/vf_loss": loss}


def critic_step(state: TrainState, batch: ValueBatch, *, graphdef, spec: CriticSpec, tx):
    """One optimiser step of the value loss over a mini-batch (micro-batches aggregated with the mini-batch's
    normaliser; a non-finite step is skipped, `train_step.apply_if_finite`)."""
    norm = losses.aggregation_normalizer(batch.completion_mask_BT, spec.agg)
    grad_fn = jax.value_and_grad(_value_loss, has_aux=True)
    loss, grads, metrics = accumulate(lambda p, mb: grad_fn(p, graphdef, mb, spec, norm), state.params, batch,
                                      spec.grad_accum, additive=frozenset({"critic/vf_loss"}))
    state, guard = apply_if_finite(state, loss, grads, tx)
    return state, {**metrics, "critic/grad_norm": guard["train/grad_norm"], "train/nonfinite": guard["train/nonfinite"]}


@functools.partial(jax.jit, static_argnames=("gamma", "lam", "whiten"))
def gae_BT(rewards_BT, values_BT, mask_BT, *, gamma: float, lam: float, whiten: bool):
    """(advantages, returns) of GAE(γ, λ), the advantages whitened over the trained tokens (`whiten`)."""
    return losses.gae_advantages(rewards_BT, values_BT, mask_BT, gamma=gamma, lam=lam, whiten=whiten)


class Critic:
    """The value model's state and its two jitted programs (values, one optimiser step).

    Args:
      graphdef: the value model's (`RewardModel`) graph.
      state: its parameters {backbone, score}, AdamW state and step, placed with `state_sharding`.
      tx: its optimiser.
      spec: `CriticSpec`.
      from_policy: the trunk is the policy RL starts from (`start_from` copies it in); False: loaded.
    """

    def __init__(self, graphdef, state: TrainState, state_sharding, tx: optax.GradientTransformation,
                 spec: CriticSpec, *, from_policy: bool):
        self.state, self.state_sharding, self.tx, self.spec = state, state_sharding, tx, spec
        self.from_policy = from_policy
        self.step_fn = jax.jit(functools.partial(critic_step, graphdef=graphdef, spec=spec, tx=tx),
                               in_shardings=(state_sharding, None), out_shardings=(state_sharding, None),
                               donate_argnums=0)
        self.values_fn = jax.jit(lambda params, tokens_BL, mask_BL, width: token_values_BT(
            nnx.merge(graphdef, params), tokens_BL, mask_BL, width), static_argnums=3)

    def start_from(self, policy_params) -> None:
        """`critic_init: policy`: the trunk becomes a copy of `policy_params` (the model RL starts from; its
        LM head, if untied, is not part of a value model), the head and a fresh AdamW state stay."""
        if not self.from_policy:
            return
        trunk = {k: v for k, v in policy_params.items() if k != "lm_head"}
        params = {"backbone": jax.tree.map(jnp.copy, trunk), "score": self.state.params["score"]}
        state = TrainState(params, self.tx.init(params), jnp.zeros((), jnp.int32))
        self.state = hosts.place_global(state, self.state_sharding)

    def arrays(self) -> dict[str, Any]:
        return {"params": self.state.params, "opt_state": self.state.opt_state}

    def load(self, arrays: dict[str, Any]) -> None:
        self.state = TrainState(arrays["params"], arrays["opt_state"], self.state.step)


def make_critic(policy_params, policy_cfg, pad_id: int, init: str, mesh, rules, tx: optax.GradientTransformation,
                spec: CriticSpec, *, seed: int) -> Critic:
    """The critic of a run, on `mesh`: `init` "policy" copies `policy_params` (the setup's model; the train
    loop copies the warm-started one in again, `Critic.start_from`) under a fresh N(0, 0.02²) head; a path
    loads a reward model (its head kept) or a language model (a fresh head). The path's tokenizer was checked
    before (`run_checks.check_teacher`)."""
    from jaxrl.io import model_io
    from jaxrl.reward_model.model import RM_MARKER, RewardModel, load_reward_model, rm_backbone_config
    from jaxrl.sharding import state_shardings

    if init == "policy":
        cfg = rm_backbone_config(policy_cfg, pad_id)
        head = nnx.initializers.normal(0.02)(jax.random.key(seed), (cfg.hidden_size, 1), jnp.dtype(cfg.param_dtype))
        trunk = {k: v for k, v in policy_params.items() if k != "lm_head"}
        params = {"backbone": jax.tree.map(jnp.copy, trunk), "score": head}
    else:
        config_dir = model_io.resolve_checkpoint(init)[0] if not (Path(init) / "config.json").is_file() else None
        if config_dir is not None and (config_dir / RM_MARKER).is_file():
            model = load_reward_model(init)[0]
        else:
            model = RewardModel.from_backbone(model_io.load_model(init)[0], pad_id, seed=seed)
        cfg, params = model.cfg, nnx.state(model, nnx.Param).to_pure_dict()
    param_state = nnx.state(RewardModel.abstract(cfg), nnx.Param)
    param_sharding = state_shardings(param_state, mesh, rules).to_pure_dict()
    opt_state = tx.init(params)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    sharding = TrainState(param_sharding, state_shardings(opt_state, mesh, rules, params=param_state), rep)
    state = hosts.place_global(TrainState(params, opt_state, jnp.zeros((), jnp.int32)), sharding)
    graphdef = nnx.graphdef(RewardModel.abstract(cfg))
    return Critic(graphdef, state, sharding, tx, spec, from_policy=init == "policy")


@dataclasses.dataclass
class ActorCritic:
    """The `UpdateSchedule` of PPO with a critic: values -> GAE advantages -> the inner schedule's policy
    update (frozen for the first `spec.warmup_steps` steps) -> the critic's own steps. Metrics: the inner
    schedule's, `critic/*` (value loss, clip fraction, mean prediction, gradient norm; `critic/values_mean`,
    `critic/returns_mean`, `critic/vf_explained_var` of the rollout) and `train/nonfinite` over both."""

    inner: Any
    critic: Critic

    def __call__(self, run, state, params, ro, adv, records, step: int, clock: step_time.StageClock, *,
                 frozen: bool) -> Updated:
        c, n_t = self.critic, ro.completion_mask_BT.shape
        rows = shard_batch(run, (ro.tokens_BL, ro.mask_BL))
        with clock("values"):
            values_BT = hosts.to_host(step_time.synced(c.values_fn(c.state.params, *rows, n_t[1])))
        mask_BT = np.asarray(ro.completion_mask_BT, bool)
        values_BT = np.where(mask_BT, values_BT, 0.0).astype(np.float32)
        adv_BT, returns_BT = jax.device_get(gae_BT(adv.adv_NT, values_BT, mask_BT, gamma=c.spec.gamma,
                                                   lam=c.spec.lam, whiten=c.spec.whiten))
        warm = step <= c.spec.warmup_steps
        out = self.inner(run, state, params, ro, adv._replace(adv_NT=np.asarray(adv_BT, np.float32)), records,
                         step, clock, frozen=frozen or warm)
        batch = shard_batch(run, ValueBatch(ro.tokens_BL, ro.mask_BL, mask_BT, values_BT,
                                            np.asarray(returns_BT, np.float32)))
        with clock("update_critic"):
            c.state, metrics = minibatch_steps(run, c.step_fn, c.state, batch,
                                               minibatch_rows(n_t[0], 1, run.update, step, stream=1))
            step_time.synced(c.state)
        nonfinite = max(metrics.pop("train/nonfinite"), out.metrics.get("train/nonfinite", 0.0))
        metrics.update(_rollout_stats(values_BT, np.asarray(returns_BT), mask_BT), **{"critic/warmup": float(warm)})
        return Updated(out.state, {**out.metrics, **metrics, "train/nonfinite": nonfinite}, out.group)

    def begin(self, policy_params) -> None:
        self.critic.start_from(policy_params)

    def arrays(self) -> dict[str, Any]:
        return {"critic": self.critic.arrays()}

    def load(self, arrays: dict[str, Any]) -> None:
        self.critic.load(arrays["critic"])


def _rollout_stats(values_BT: np.ndarray, returns_BT: np.ndarray, mask_BT: np.ndarray) -> dict[str, float]:
    """The rollout's mean value and return on the trained tokens, and verl's explained variance
    `critic/vf_explained_var` = 1 − Var(R − V) / (Var(R) + 1e-5) (unbiased variances)."""
    v, r = values_BT[mask_BT].astype(np.float64), returns_BT[mask_BT].astype(np.float64)
    if v.size < 2:
        return {}
    return {"critic/values_mean": float(v.mean()), "critic/returns_mean": float(r.mean()),
            "critic/vf_explained_var": 1.0 - float(np.var(r - v, ddof=1)) / (float(np.var(r, ddof=1)) + 1e-5)}
