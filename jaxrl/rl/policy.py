"""The `Policy` plug-in: what the trained parameters are, and how they become what the rest of the step uses.

    Dense            trained = the model           sampling = trained          reference = a frozen copy
    LoRA             trained = adapters            sampling = base ⊕ adapters  reference = the (frozen) base
    PerRoleAdapters  trained = {role: adapters}    sampling = {role: merged}   reference = the inner policy's

Setup (`jaxrl.rl.setup.setup`) builds one; the step, the update and the train loop call it without asking
which one they got. The reference is None when the run has no KL (β = 0 keeps no second copy in memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import jax

from jaxrl.errors import CheckpointError
from jaxrl.models import lora
from jaxrl.multi_agent import adapters as role_adapters
from jaxrl.learner.train_step import TrainState

WarmStart = Callable[[TrainState], "tuple[TrainState, list[float]]"]


class Policy(Protocol):
    """How the trained parameters become the sampling parameters, the reference and the train view."""

    frozen: Any  # what the train step takes next to the trained params (LoRA: the base); None: nothing
    roles: tuple[str, ...]  # roles with their own trained parameters; (): one set for every role

    @property
    def reference(self) -> Any | None: ...  # the KL reference's full parameters; None without KL

    @property
    def reference_follows_warm_start(self) -> bool: ...  # the reference is the warm-started model itself

    def set_reference(self, params) -> None: ...

    def sampling_params(self, trained) -> Any: ...

    def train_view(self, state: TrainState, role: str | None) -> TrainState: ...

    def with_train_view(self, state: TrainState, role: str | None, view: TrainState) -> TrainState: ...

    def warm_start(self, state: TrainState, warm_start: WarmStart) -> tuple[TrainState, list[float]]: ...

    def checkpoint_extra(self) -> dict[str, Any]: ...

    def check_restore(self, extra: Mapping[str, Any], directory) -> None: ...

    def export(self, trained, out: Path) -> None: ...


class Dense:
    """The whole model is trained and sampled; the reference (with KL) is a frozen copy of the model RL
    starts from (after the SFT warm start, when there is one)."""

    frozen = None
    roles: tuple[str, ...] = ()

    def __init__(self, reference=None):
        self._reference = reference

    @property
    def reference(self):
        return self._reference

    @property
    def reference_follows_warm_start(self) -> bool:
        return self._reference is not None

    def set_reference(self, params) -> None:
        """The reference is now `params` (the warm-started model; not copied)."""
        self._reference = params

    def sampling_params(self, trained):
        return trained

    def train_view(self, state: TrainState, role: str | None) -> TrainState:
        del role  # every role's rows train the one model
        return state

    def with_train_view(self, state: TrainState, role: str | None, view: TrainState) -> TrainState:
        del state, role
        return view

    def warm_start(self, state: TrainState, warm_start: WarmStart) -> tuple[TrainState, list[float]]:
        return warm_start(state)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {}

    def check_restore(self, extra: Mapping[str, Any], directory) -> None:
        del extra, directory

    def export(self, trained, out: Path) -> None:
        del trained, out  # the checkpoint is the model


class LoRA(Dense):
    """Adapters over a frozen (maybe quantised) base: the sampler runs base ⊕ adapters, merged once per step;
    the reference (with KL) is the base itself, so it is never rebuilt from the warm start.

    Args:
      base: the frozen base (int8 / nf4 kernels under QLoRA).
      cfg: the adapters' rank, α and targets.
      base_sha256: fingerprint of the dense base (`jaxrl.io.lora_io.base_fingerprint`), checkpointed and checked
        on resume.
      base_path: where the base came from, recorded next to exported adapters ("" for a preset).
      kl: whether the run needs a reference.
    """

    def __init__(self, base, cfg: lora.LoraConfig, base_sha256: str, base_path: str, *, kl: bool):
        super().__init__(base if kl else None)
        self.frozen, self.cfg, self.base_sha256, self.base_path = base, cfg, base_sha256, base_path
        self._merge = jax.jit(lambda b, a: lora.merge(b, a, cfg))

    @property
    def reference_follows_warm_start(self) -> bool:
        return False

    def sampling_params(self, trained):
        return self._merge(self.frozen, trained)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"lora_base_sha256": self.base_sha256}

    def check_restore(self, extra: Mapping[str, Any], directory) -> None:
        """Adapters trained on another base are refused (a checkpoint without a fingerprint is accepted)."""
        saved = extra.get("lora_base_sha256")
        if saved not in (None, self.base_sha256):
            raise CheckpointError(f"the LoRA adapters in {directory} were trained on a different base model "
                                  f"(sha256 {saved[:12]}..., this run's base {self.base_sha256[:12]}...)")

    def export(self, trained, out: Path) -> None:
        """The latest adapters in the `jaxrl.io.lora_io` layout with their base's path and sha256, so that
        `jaxrl export-hf --checkpoint RUN/adapters --merge | --peft` exports them (a preset base has no path:
        pass --base)."""
        from jaxrl.io import lora_io

        ref = {"path": self.base_path, "sha256": self.base_sha256}
        lora_io.save_adapters(out, trained, self.cfg, ref, overwrite=True)


class PerRoleAdapters:
    """One trained parameter set per role (`multi_agent.adapters: per_role`, `jaxrl.multi_agent.adapters`):
    trained = {role: params of `inner`}; a role samples `inner`'s sampling params of its own set (merged on
    first use, `RolePolicies`), trains only its own set with its own optimiser state, and exports to
    `out/<role>`. The SFT warm start trains the first role's set on every role's demonstrations, then seeds
    every role with it."""

    def __init__(self, inner: Dense, roles: tuple[str, ...], aliases: Mapping[str, str]):
        self.inner, self.roles, self.aliases = inner, tuple(roles), dict(aliases)
        self.frozen = inner.frozen

    @property
    def reference(self):
        return self.inner.reference

    @property
    def reference_follows_warm_start(self) -> bool:
        return self.inner.reference_follows_warm_start

    def set_reference(self, params) -> None:
        self.inner.set_reference(params)

    def sampling_params(self, trained) -> role_adapters.RolePolicies:
        return role_adapters.RolePolicies(trained, self.inner.sampling_params, self.aliases)

    def train_view(self, state: TrainState, role: str | None) -> TrainState:
        if role not in self.roles:
            raise ValueError(f"per-role adapters: update of role {role!r}, roles {self.roles}")
        return role_adapters.role_state(state, role)

    def with_train_view(self, state: TrainState, role: str | None, view: TrainState) -> TrainState:
        return role_adapters.with_role_state(state, role, view)

    def warm_start(self, state: TrainState, warm_start: WarmStart) -> tuple[TrainState, list[float]]:
        view, curve = warm_start(role_adapters.role_state(state, self.roles[0]))
        return role_adapters.seed_roles(state, view.params), curve

    def checkpoint_extra(self) -> dict[str, Any]:
        return self.inner.checkpoint_extra()

    def check_restore(self, extra: Mapping[str, Any], directory) -> None:
        self.inner.check_restore(extra, directory)

    def export(self, trained, out: Path) -> None:
        for role in self.roles:
            self.inner.export(trained[role], out / role)
