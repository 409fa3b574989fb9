"""One LoRA adapter per role (`multi_agent.adapters: per_role`): the roles share the frozen base, not the weights.

With `shared` (the default) every role samples and trains the one policy, so an update of one role's rows moves
all roles: on the tiny MARCH world, GRPO on the Solver alone made the Proposer stop writing claims
(docs/multi_agent.md). With `per_role` (and `model.lora`) the trained parameters are one adapter set per role,

    θ_r = W_base + (α/r)·A_r·B_r,      params = {role: adapters_r},  opt_state = {role: AdamW state_r}

and a role's rows update only its own adapters with its own optimiser state (one phase per trained role,
`jaxrl.rl.update.Phased`); a role that is not trained keeps the adapters the SFT warm start left. The
warm start trains one adapter set on every role's demonstrations, which then seeds every role's copy.

Sampling: a system asks `role_params(params, role)` for the weights of the role it generates; under
`per_role` the policy is a `RolePolicies` mapping that merges a role's adapters on first use (one merged copy
per role that samples in the step). Spec: spec/multi-agent.md §0 ("an adapter per role once LoRA exists").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from jaxrl.learner.train_step import TrainState

MODES = ("shared", "per_role")


class RolePolicies(Mapping):
    """role -> the full parameters that role samples with, built by `policy(adapters_of_role)` on first use."""

    def __init__(self, adapters: Mapping[str, Any], policy: Callable[[Any], Any], aliases: Mapping[str, str]):
        self._adapters, self._policy, self._aliases = adapters, policy, dict(aliases)
        self._merged: dict[str, Any] = {}

    def __getitem__(self, role: str):
        role = self._aliases.get(role, role)
        if role not in self._adapters:
            raise KeyError(f"no adapters for role {role!r} (roles: {sorted(self._adapters)})")
        if role not in self._merged:
            self._merged[role] = self._policy(self._adapters[role])
        return self._merged[role]

    def __iter__(self):
        return iter(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)


def role_params(params, role: str):
    """The parameters `role` samples with: `params[role]` of a `RolePolicies`, else the shared `params`."""
    return params[role] if isinstance(params, RolePolicies) else params


def per_role_state(state: TrainState, roles: Sequence[str]) -> TrainState:
    """A state holding one independent copy per role of `state`'s params and optimiser state (copies with
    the same shardings, not aliases: each role's buffers are donated to its own update)."""
    copy = lambda tree: jax.tree.map(jnp.copy, tree)
    return TrainState({r: copy(state.params) for r in roles}, {r: copy(state.opt_state) for r in roles},
                      state.step)


def role_state(state: TrainState, role: str) -> TrainState:
    """The single-role view (params and optimiser state of `role`) that the jitted train step updates."""
    return TrainState(state.params[role], state.opt_state[role], state.step)


def with_role_state(state: TrainState, role: str, sub: TrainState) -> TrainState:
    """`state` with `role`'s params and optimiser state replaced by `sub`'s (the step counter from `sub`)."""
    return TrainState({**state.params, role: sub.params}, {**state.opt_state, role: sub.opt_state}, sub.step)


def seed_roles(state: TrainState, adapters) -> TrainState:
    """Every role's adapters set to (copies of) `adapters` (the warm start's), optimiser states kept."""
    return TrainState({r: jax.tree.map(jnp.copy, adapters) for r in state.params}, state.opt_state, state.step)
