"""PPO's value model (`jaxrl.rl.critic`): its parameters, its two jitted programs and how a run builds it.

    V_BT = w · h(x)[W − 1 + t]     h: the trunk's final normed hidden state, w: a [D, 1] head

The trunk and head are a `jaxrl.reward_model.RewardModel`'s (no LM head), read at every completion position.
Two forms of trunk:

    dense  {backbone, score}   a full copy: of the model RL starts from (`critic_init: policy`), or a model /
                               trained reward model at a path
    LoRA   {adapters, score}   adapters of its own over the LoRA policy's frozen (maybe quantised) base
                               (`ppo.critic_lora`, with `model.lora`; verl's LoRA critic): no second trunk in
                               memory; fresh adapters (B = 0), so the trunk starts as the base

Both train the value loss with their own AdamW, skipping a non-finite step (`train_step.apply_if_finite`);
gradient accumulation divides every micro-batch by the whole mini-batch's token count.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl import losses
from jaxrl.models import lora
from jaxrl.sharding import hosts
from jaxrl.learner.train_step import TrainState, accumulate, apply_if_finite, full_params


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
    """The critic's static settings (`algorithm.ppo`, the run's aggregation and micro-batches; `lora`: the
    adapters' config of a LoRA critic, None for a dense one)."""

    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float | None = 0.5
    whiten: bool = True
    warmup_steps: int = 0
    agg: losses.AggMode = losses.AggMode.TOKEN_MEAN
    grad_accum: int = 1
    lora: Any = None


def token_values_BT(model, tokens_BL: jax.Array, mask_BL: jax.Array, width: int) -> jax.Array:
    """V_BT (float32): the value head on the hidden states that predict the last `width` tokens of each row."""
    length = tokens_BL.shape[1]
    out = model.backbone.forward(tokens_BL, None, mask_BL, return_hidden=True, return_logits=False)
    hidden_BTD = out.hidden[:, length - width - 1:length - 1]
    w_D1 = model.score[...].astype(hidden_BTD.dtype)
    return jnp.einsum("BTD,DO->BTO", hidden_BTD, w_D1, preferred_element_type=jnp.float32)[..., 0]


def trunk_of(model_params) -> dict:
    """A language model's parameters as a value model's trunk: all but an untied LM head."""
    return {k: v for k, v in model_params.items() if k != "lm_head"}


def value_model(graphdef, params, base, lora_cfg):
    """The `RewardModel` of the critic's parameters: the dense trunk, or the base ⊕ the critic's adapters (the
    base frozen)."""
    if lora_cfg is None:
        return nnx.merge(graphdef, params)
    trunk = trunk_of(full_params(params["adapters"], base, lora_cfg))
    return nnx.merge(graphdef, {"backbone": trunk, "score": params["score"]})


def _value_loss(params, base, graphdef, batch: ValueBatch, spec: CriticSpec, norm):
    values_BT = token_values_BT(value_model(graphdef, params, base, spec.lora), batch.tokens_BL, batch.mask_BL,
                                batch.completion_mask_BT.shape[1])
    loss, metrics = losses.value_loss(values_BT, batch.old_values_BT, batch.returns_BT, batch.completion_mask_BT,
                                      clip=spec.value_clip, agg=spec.agg, normalizer=norm)
    return loss, {**metrics, "critic/vf_loss": loss}


def critic_step(state: TrainState, batch: ValueBatch, base=None, *, graphdef, spec: CriticSpec, tx):
    """One optimiser step of the value loss over a mini-batch (`base`: a LoRA critic's frozen base)."""
    norm = losses.aggregation_normalizer(batch.completion_mask_BT, spec.agg)
    grad_fn = jax.value_and_grad(_value_loss, has_aux=True)
    loss, grads, metrics = accumulate(lambda p, mb: grad_fn(p, base, graphdef, mb, spec, norm), state.params,
                                      batch, spec.grad_accum, additive=frozenset({"critic/vf_loss"}))
    state, guard = apply_if_finite(state, loss, grads, tx)
    return state, {**metrics, "critic/grad_norm": guard["train/grad_norm"],
                   "train/nonfinite": guard["train/nonfinite"]}


class Critic:
    """The value model's state and its two jitted programs: `values_fn(params, base, tokens_BL, mask_BL, T)`
    and `step_fn(state, batch)` (the state donated).

    Args:
      graphdef: the value model's (`RewardModel`) graph.
      state: its parameters, AdamW state and step, placed with `state_sharding`.
      tx: its optimiser.
      spec: `CriticSpec`.
      from_policy: the dense trunk is the policy RL starts from (`start_from` copies it in); False: loaded, or
        a LoRA critic (its fresh adapters over the base).
      base: a LoRA critic's frozen base (the LoRA policy's), None for a dense critic.
    """

    def __init__(self, graphdef, state: TrainState, state_sharding, tx: optax.GradientTransformation,
                 spec: CriticSpec, *, from_policy: bool, base=None):
        self.state, self.state_sharding, self.tx, self.spec = state, state_sharding, tx, spec
        self.from_policy, self.base = from_policy, base
        step = jax.jit(functools.partial(critic_step, graphdef=graphdef, spec=spec, tx=tx),
                       in_shardings=(state_sharding, None, None), out_shardings=(state_sharding, None),
                       donate_argnums=0)
        self.step_fn = lambda state, batch: step(state, batch, base)
        self.values_fn = jax.jit(lambda params, base, tokens_BL, mask_BL, width: token_values_BT(
            value_model(graphdef, params, base, spec.lora), tokens_BL, mask_BL, width), static_argnums=4)

    def values(self, tokens_BL, mask_BL, width: int) -> jax.Array:
        return self.values_fn(self.state.params, self.base, tokens_BL, mask_BL, width)

    def start_from(self, policy_params) -> None:
        """`critic_init: policy` (dense): the trunk becomes a copy of `policy_params` (the model RL starts
        from), the head and a fresh AdamW state stay."""
        if not self.from_policy:
            return
        params = {"backbone": jax.tree.map(jnp.copy, trunk_of(policy_params)), "score": self.state.params["score"]}
        state = TrainState(params, self.tx.init(params), jnp.zeros((), jnp.int32))
        self.state = hosts.place_global(state, self.state_sharding)

    def arrays(self) -> dict[str, Any]:
        return {"params": self.state.params, "opt_state": self.state.opt_state}

    def load(self, arrays: dict[str, Any]) -> None:
        self.state = TrainState(arrays["params"], arrays["opt_state"], self.state.step)


def make_critic(policy_params, policy_cfg, pad_id: int, init: str, mesh, rules, tx: optax.GradientTransformation,
                spec: CriticSpec, *, seed: int, base=None) -> Critic:
    """The critic of a run, on `mesh`. Dense (`spec.lora` None): `init` "policy" copies `policy_params` (the
    setup's model; the train loop copies the warm-started one in again, `Critic.start_from`) under a fresh
    N(0, 0.02²) head; a path loads a reward model (its head kept) or a language model (a fresh head); the
    path's tokenizer was checked before (`run_checks.check_teacher`). LoRA: fresh adapters over `base`."""
    from jaxrl.reward_model.model import RewardModel, rm_backbone_config
    from jaxrl.rl.run import placed_shardings
    from jaxrl.sharding import state_shardings
    from jaxrl.sharding.lora import adapter_shardings

    cfg = rm_backbone_config(policy_cfg, pad_id)
    head = nnx.initializers.normal(0.02)(jax.random.key(seed), (cfg.hidden_size, 1), jnp.dtype(cfg.param_dtype))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    if spec.lora is not None:
        adapters = lora.init_adapters(base, spec.lora, jax.random.key(seed + 1))
        params = hosts.place_global({"adapters": adapters, "score": head},
                                    {"adapters": adapter_shardings(adapters, mesh, rules), "score": rep})
        param_sharding, opt_state = placed_shardings(params, mesh), tx.init(params)
        opt_sharding = placed_shardings(opt_state, mesh)
    else:
        if init == "policy":
            params = {"backbone": jax.tree.map(jnp.copy, trunk_of(policy_params)), "score": head}
        else:
            cfg, params = _load(init, pad_id, seed)
        param_state = nnx.state(RewardModel.abstract(cfg), nnx.Param)
        param_sharding = state_shardings(param_state, mesh, rules).to_pure_dict()
        opt_state = tx.init(params)
        opt_sharding = state_shardings(opt_state, mesh, rules, params=param_state)
    sharding = TrainState(param_sharding, opt_sharding, rep)
    state = hosts.place_global(TrainState(params, opt_state, jnp.zeros((), jnp.int32)), sharding)
    graphdef = nnx.graphdef(RewardModel.abstract(cfg))
    return Critic(graphdef, state, sharding, tx, spec, from_policy=init == "policy" and spec.lora is None,
                  base=base if spec.lora is not None else None)


def _load(path: str, pad_id: int, seed: int):
    """(config, params) of the value model at `path`: a reward model (its head kept) or a language model
    (a fresh head on its trunk)."""
    from jaxrl.io import model_io
    from jaxrl.reward_model.model import RM_MARKER, RewardModel, load_reward_model

    config_dir = None if (Path(path) / "config.json").is_file() else model_io.resolve_checkpoint(path)[0]
    if config_dir is not None and (config_dir / RM_MARKER).is_file():
        model = load_reward_model(path)[0]
    else:
        model = RewardModel.from_backbone(model_io.load_model(path)[0], pad_id, seed=seed)
    return model.cfg, nnx.state(model, nnx.Param).to_pure_dict()
