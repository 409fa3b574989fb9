"""Device meshes: `MeshConfig` and `make_mesh`, the only place jaxrl creates mesh axis names.

Three mesh axes, always in this order (outermost first, so `tensor` lands on the fastest interconnect):

* `data`   — pure data parallelism: parameters replicated, batch split.
* `fsdp`   — fully-sharded data parallelism: batch split *and* parameters/optimizer state split (ZeRO-3).
* `tensor` — tensor (Megatron) parallelism: heads / MLP hidden / vocab split (only with the `fsdp_tp` rules).

Multi-slice (several TPU slices joined over the data-centre network): `dcn_data` / `dcn_fsdp` say how many
of the `data` / `fsdp` ways cross slices; the rest stay inside one slice (ICI). The mesh is then built with
`mesh_utils.create_hybrid_device_mesh`, so only the outer factor of an axis ever talks over DCN.

Deviation from MaxText: one set of sizes (`data`, `fsdp`, `tensor` are *total* axis sizes) plus DCN factors,
instead of separate `ici_*` and `dcn_*` sizes for a dozen axes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from jaxrl.errors import ConfigError

AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
RULE_SETS: tuple[str, ...] = ("fsdp", "fsdp_tp")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the `data`, `fsdp` and `tensor` mesh axes.

    Attributes:
      data: size of the data-parallel axis; -1 means "all devices not used by the other axes".
      fsdp: size of the fully-sharded axis; -1 means the rest (the default: pure FSDP over every device).
      tensor: size of the tensor-parallel axis (needs `rules="fsdp_tp"` when > 1).
      dcn_data: how many of the `data` ways go across slices (multi-slice only; must divide `data`).
      dcn_fsdp: how many of the `fsdp` ways go across slices (multi-slice only; must divide `fsdp`).
      rules: logical-axis rule table, `"fsdp"` or `"fsdp_tp"` (see `jaxrl.sharding.rules`).
      rollout_devices: devices set apart for the sampler (`jaxrl.rl.placement`): the first N sample on a mesh
        of their own (FSDP over them, `tensor` kept; with P processes the first N / P of each), the others form
        the training mesh that data x fsdp x tensor describes. 0 (default): both share every device.
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1
    rules: str = "fsdp"
    rollout_devices: int = 0

    def __post_init__(self):
        if not isinstance(self.rollout_devices, int) or self.rollout_devices < 0:
            raise ConfigError(f"mesh.rollout_devices={self.rollout_devices!r}: must be an integer >= 0 (0: the "
                              "sampler shares the training devices)")
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            if size != -1 and size < 1:
                raise ConfigError(
                    f"mesh.{name}={size}: a mesh axis size must be a positive integer or -1 (the rest)"
                )
        wild = [n for n, s in sizes.items() if s == -1]
        if len(wild) > 1:
            got = ", ".join("mesh." + n for n in wild)
            raise ConfigError(f"mesh: at most one axis may be -1 (the rest), got {got}")
        for name in ("dcn_data", "dcn_fsdp"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"mesh.{name}={getattr(self, name)}: must be a positive integer (1 = one slice)"
                )
        if self.rules not in RULE_SETS:
            allowed = ", ".join(map(repr, RULE_SETS))
            raise ConfigError(f"mesh.rules={self.rules!r}: allowed values are {allowed}")
        if self.rules == "fsdp" and self.tensor not in (1, -1):
            raise ConfigError(
                f"mesh.tensor={self.tensor} but mesh.rules='fsdp' never uses the tensor axis; "
                "set mesh.rules='fsdp_tp'"
            )

    @property
    def num_slices(self) -> int:
        return self.dcn_data * self.dcn_fsdp

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """The (data, fsdp, tensor) sizes for `num_devices` devices, with -1 resolved; raises ConfigError."""
        sizes = [self.data, self.fsdp, self.tensor]
        known = math.prod(s for s in sizes if s != -1)
        described = "x".join("?" if s == -1 else str(s) for s in sizes)
        if -1 in sizes:
            if num_devices % known:
                raise ConfigError(
                    f"mesh data x fsdp x tensor = {described}: the fixed sizes multiply to {known}, "
                    f"which does not divide the {num_devices} devices"
                )
            sizes[sizes.index(-1)] = num_devices // known
        elif known != num_devices:
            raise ConfigError(
                f"mesh data x fsdp x tensor = {described} = {known} devices, but {num_devices} devices are "
                f"available; make the sizes multiply to {num_devices} or set one of them to -1"
            )
        data, fsdp, tensor = sizes
        for name, size, dcn in (("data", data, self.dcn_data), ("fsdp", fsdp, self.dcn_fsdp)):
            if size % dcn:
                raise ConfigError(f"mesh.dcn_{name}={dcn} does not divide mesh.{name}={size}")
        return data, fsdp, tensor


def device_grid(cfg: MeshConfig, devices: Sequence[jax.Device]) -> np.ndarray:
    """The [data, fsdp, tensor] array of devices for a multi-slice config (the DCN factors on the outside)."""
    shape = cfg.shape(len(devices))
    dcn_shape = (cfg.dcn_data, cfg.dcn_fsdp, 1)
    ici_shape = tuple(s // d for s, d in zip(shape, dcn_shape))
    try:
        return np.asarray(mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, devices))
    except (ValueError, AttributeError) as e:
        raise ConfigError(
            f"mesh: cannot split {len(devices)} devices into {cfg.num_slices} slices "
            f"(dcn_data={cfg.dcn_data}, dcn_fsdp={cfg.dcn_fsdp}) of shape {ici_shape}: {e}"
        ) from e


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` with axes ("data", "fsdp", "tensor") and Auto (GSPMD) axis types.

    Auto, not jax 0.10's default Explicit: our code constrains shardings at block boundaries and lets GSPMD
    propagate the rest; Explicit axes would demand an `out_sharding` on every contraction over a sharded axis.
    """
    devices = list(jax.devices() if devices is None else devices)
    axis_types = (AxisType.Auto,) * len(AXES)
    if cfg.num_slices == 1:
        return jax.make_mesh(cfg.shape(len(devices)), AXES, axis_types=axis_types, devices=devices)
    return Mesh(device_grid(cfg, devices), AXES, axis_types=axis_types)
