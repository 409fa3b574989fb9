"""`jaxrl plan`: per-device memory of a training run on a device mesh, from abstract shapes only.

Parameters come from `Transformer.abstract` (`nnx.eval_shape`: nothing is allocated, so an 8B model plans in
seconds on a laptop CPU) and are split with the same rule tables the trainer uses; per-device sizes follow
from the PartitionSpecs and the mesh axis sizes, without building a real mesh.

Per-device estimate (bytes), with b = batch / (data·fsdp) rows, t = tensor ways (1 with the `fsdp` rules),
act = bytes of `cfg.dtype`, x = b·L tokens:

* params      Σ over parameters of (shard elements) · bytes(param_dtype); ×2 with a reference model (KL).
* optimizer   AdamW: two float32 moments per parameter, sharded like the parameter: 2 · 4 · shard elements.
* gradients   one per parameter, in param_dtype, sharded like the parameter.
* activations saved for the backward pass, per layer and token (elements), then × x · Y · act:
    remat none:  4D + (2NH + 2KH)/t + 3F/t + 2NL/t   (norm in/out and residuals; q, k, v, context;
                                                      gate, up, silu·up; attention scores and probabilities)
    remat dots:  2D + (2NH + 2KH)/t + 2F/t +  NL/t   (matmul outputs only)
    remat mlp:   4D + (2NH + 2KH)/t        + 2NL/t   (`none` without the MLP's F-wide products)
    remat attention: D + NH/t + 2N/t                 (the layer's input, the attention core's output and its
                                                      per-query softmax max and normaliser)
    remat full:  D                                   (each layer's input only)
  plus, for dots/attention/full, one layer recomputed during backward (the `none` set of one layer; for mlp
  one layer's 3F/t), plus the float32
  logits and their gradient: 2 · 4 · x · min(C, V/t), where C is the vocabulary chunk of the trainer's
  checkpointed log-prob computation (`losses.token_logprobs_and_entropy`, C = 8192; None = whole vocabulary).
* kv_cache    rollout: 2 · Y · (rollout_batch / (data·fsdp)) · S · K/t · H · act, plus the bool slot mask.

Peak = params + optimizer + max(gradients + activations, kv_cache): sampling and the train step do not hold
their buffers at the same time. The estimate ignores XLA temporaries and fragmentation; keep ~10% headroom.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.errors import ConfigError
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.models.config import REMATS
from jaxrl.sharding import AXES, RULES, MeshConfig, logical_names, logical_to_spec
from jaxrl.sharding.place import path_str
from jaxrl.sharding.rules import check_divisible, spec_axes

GIB = 1024**3
# HBM per chip (GiB) as the accelerator exposes it to one JAX device.
HBM_GIB: dict[str, float] = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "h100": 80, "h200": 141}


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-device bytes of each component and whether the peak fits the accelerator."""

    mesh_shape: tuple[int, int, int]
    num_params: int
    params: int
    optimizer: int
    gradients: int
    activations: int
    kv_cache: int
    accelerator: str
    hbm: int

    @property
    def peak(self) -> int:
        return self.params + self.optimizer + max(self.gradients + self.activations, self.kv_cache)

    @property
    def fits(self) -> bool:
        return self.peak <= self.hbm

    def table(self) -> str:
        data, fsdp, tensor = self.mesh_shape
        rows = [("params", self.params), ("optimizer (AdamW, fp32)", self.optimizer),
                ("gradients", self.gradients), ("activations", self.activations),
                ("kv cache (rollout)", self.kv_cache), ("peak", self.peak),
                (f"HBM ({self.accelerator})", self.hbm)]
        lines = [f"mesh data={data} fsdp={fsdp} tensor={tensor}; {self.num_params / 1e9:.3f} B parameters",
                 f"{'per device':<26}{'GiB':>10}"]
        lines += [f"{name:<26}{size / GIB:>10.3f}" for name, size in rows]
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(f"{verdict}: peak is {100 * self.peak / self.hbm:.1f}% of HBM")
        return "\n".join(lines)


def _shard_elements(shape, spec, sizes: dict[str, int]) -> int:
    return math.prod(n // math.prod(sizes[a] for a in spec_axes(e)) for n, e in zip(shape, spec))


def param_bytes_per_device(cfg: TransformerConfig, sizes: dict[str, int], rules_name: str) -> tuple[int, int]:
    """(number of parameters, per-device parameter elements) of the abstract model under the rules."""
    rules = RULES[rules_name]
    state = nnx.state(Transformer.abstract(cfg), nnx.Param)
    flat, _ = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    total = local = 0
    for path, var in flat:
        shape = tuple(var.get_value().shape)
        names = logical_names(var) or (None,) * len(shape)
        spec = logical_to_spec(names, rules)
        check_divisible(shape, spec, sizes, what=path_str(path))
        total += math.prod(shape)
        local += _shard_elements(shape, spec, sizes)
    return total, local


def activation_elements_per_token(cfg: TransformerConfig, remat: str, seq_len: int, t: int) -> int:
    """Saved elements per token and layer (module docstring), with tensor-parallel division by t."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    heads = (2 * n * h + 2 * k * h) // t
    if remat == "none":
        return 4 * d + heads + 3 * f // t + 2 * n * seq_len // t
    if remat == "dots":
        return 2 * d + heads + 2 * f // t + n * seq_len // t
    if remat == "mlp":
        return 4 * d + heads + 2 * n * seq_len // t
    if remat == "attention":
        return d + (n * h + 2 * n) // t
    return d


def plan_memory(
    model_cfg: TransformerConfig,
    mesh_cfg: MeshConfig,
    num_devices: int,
    *,
    batch: int,
    seq_len: int,
    rollout_batch: int,
    rollout_len: int,
    remat: str | None = None,
    accelerator: str = "v5p",
    reference_model: bool = False,
    logits_chunk: int | None = 8192,
) -> Plan:
    """Per-device memory of training `model_cfg` on `num_devices` devices laid out by `mesh_cfg`.

    Args:
      batch: sequences per optimizer micro-step (all devices together).
      seq_len: their length (prompt + completion).
      rollout_batch: sequences sampled at once (prompts × group size); rollout_len: KV-cache capacity S.
      remat: one of REMATS (default: `model_cfg.remat`).
      accelerator: a key of `HBM_GIB`.
      reference_model: also hold a frozen copy of the parameters (KL to a reference policy).
      logits_chunk: vocabulary columns materialised at once by the log-prob computation (None: all).
    """
    remat = model_cfg.remat if remat is None else remat
    if remat not in REMATS:
        raise ConfigError(f"remat={remat!r}: allowed values are {', '.join(map(repr, REMATS))}")
    if accelerator not in HBM_GIB:
        raise ConfigError(f"accelerator={accelerator!r}: allowed values are {', '.join(HBM_GIB)}")
    shape = mesh_cfg.shape(num_devices)
    sizes = dict(zip(AXES, shape))
    data, fsdp, t = shape
    rows = data * fsdp
    for name, value in (("batch", batch), ("rollout batch", rollout_batch)):
        if value % rows:
            raise ConfigError(f"{name} {value} is not divisible by data x fsdp = {data} x {fsdp} = {rows}")
    num_params, local = param_bytes_per_device(model_cfg, sizes, mesh_cfg.rules)
    p_bytes = jnp.dtype(model_cfg.param_dtype).itemsize
    a_bytes = jnp.dtype(model_cfg.dtype).itemsize
    tokens = batch // rows * seq_len
    per_token = activation_elements_per_token(model_cfg, remat, seq_len, t)
    recompute = {"none": 0, "mlp": 3 * model_cfg.mlp_dim // t}.get(
        remat, activation_elements_per_token(model_cfg, "none", seq_len, t))
    acts = tokens * a_bytes * (model_cfg.num_layers * per_token + recompute)
    vocab_cols = model_cfg.vocab_size // t
    acts += 2 * 4 * tokens * (vocab_cols if logits_chunk is None else min(logits_chunk, vocab_cols))
    if model_cfg.num_kv_heads % t:
        raise ConfigError(f"kv_cache: num_kv_heads={model_cfg.num_kv_heads} is not divisible by mesh axis "
                          f"tensor={t}")
    r = rollout_batch // rows
    kv_heads = model_cfg.num_kv_heads // t
    kv = 2 * model_cfg.num_layers * r * rollout_len * kv_heads * model_cfg.head_dim * a_bytes
    kv += r * rollout_len
    params = local * p_bytes * (2 if reference_model else 1)
    return Plan(mesh_shape=shape, num_params=num_params, params=params, optimizer=2 * 4 * local,
                gradients=local * p_bytes, activations=acts, kv_cache=kv, accelerator=accelerator,
                hbm=int(HBM_GIB[accelerator] * GIB))
