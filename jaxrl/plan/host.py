"""Per-host host-memory (RAM) needs of a run, next to `jaxrl.plan.memory`'s per-chip device memory.

A multi-host job keeps in each host's RAM (tpu/README.md, "How a step is split across hosts"):

* runtime     Python, JAX and the XLA compiler of one process: a fixed `runtime_gib` (≈ 1.5 GiB measured
              for the CLI on CPU; 2 GiB by default).
* staging     orbax copies the host's shards of parameters and AdamW moments to RAM before writing a
              checkpoint (and reads them back on restore): Σ over the host's chips of (params + optimizer)
              per chip, i.e. chips_per_host · (P_dev + O_dev) with P_dev, O_dev from `jaxrl.plan.memory.Plan`
              (the reference copy of a KL run is not checkpointed). Under LoRA / QLoRA a checkpoint holds the
              adapters and their moments only: pass `lora_plan`'s adapters bytes (`jaxrl.commands.plan`) and
              the Plan's optimizer row, not the base.
* load        the initial weights read from safetensors / orbax on every host before they are placed:
              num_params · bytes(param dtype), the whole model (an upper bound; not at the same time as a
              checkpoint save).
* rollout     every host holds the whole rollout batch on the host: R = prompts·G·(1 + resample rounds)
              rows of width L = prompt + completion (int32 tokens and a bool mask, 5 bytes per position) and
              of completion width T (bool mask, float32 old log-probs, advantages and reference log-probs,
              and the sampler's gathered int32 tokens and float32 log-probs: 21 bytes per position):
              R · (5 L + 21 T).

peak = runtime + rollout + max(staging, load). The estimate ignores the data records, tokenizer and
Python object overheads (small next to the model); keep ~20% headroom.
"""

from __future__ import annotations

import dataclasses

from jaxrl.plan.memory import GIB

# Host bytes per row position of the rollout arrays (module docstring).
FULL_WIDTH_BYTES = 5
COMPLETION_WIDTH_BYTES = 21


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """Per-host RAM bytes of each component (module docstring)."""

    chips_per_host: int
    runtime: int
    staging: int
    load: int
    rollout: int

    @property
    def peak(self) -> int:
        return self.runtime + self.rollout + max(self.staging, self.load)

    def table(self) -> str:
        rows = [("runtime (python, jax, xla)", self.runtime), ("checkpoint staging", self.staging),
                ("initial weight load", self.load), ("rollout arrays", self.rollout), ("peak", self.peak)]
        lines = [f"{'per host (' + str(self.chips_per_host) + ' chips)':<30}{'GiB':>10}"]
        lines += [f"{name:<30}{size / GIB:>10.3f}" for name, size in rows]
        return "\n".join(lines)


def plan_host(*, params_per_chip: int, optimizer_per_chip: int, chips_per_host: int, num_params: int,
              param_bytes: int, rollout_rows: int, prompt_len: int, completion_len: int,
              resample_rounds: int = 0, runtime_gib: float = 2.0) -> HostPlan:
    """Host-RAM needs of one host.

    Args:
      params_per_chip, optimizer_per_chip: bytes per chip of the trained parameters (one copy, without a
        reference model; the adapters alone under LoRA) and of the AdamW moments
        (`jaxrl.plan.memory.Plan.optimizer`).
      chips_per_host: devices attached to one host (4 on v4 / v5p / multi-host v5e and v6e slices).
      num_params: parameter count; param_bytes: bytes per parameter of the stored weights.
      rollout_rows: prompts per step × group size; prompt_len: padded prompt width (the prompt bucket);
        completion_len: max_new_tokens (or the gen bucket).
      resample_rounds: DAPO's extra rollouts held at once (dapo's `algorithm.params.max_tries`, 0 otherwise).
      runtime_gib: fixed RAM of the process itself.
    """
    for name, value in (("chips_per_host", chips_per_host), ("rollout_rows", rollout_rows)):
        if value < 1:
            raise ValueError(f"{name}={value}: must be >= 1")
    rows = rollout_rows * (1 + resample_rounds)
    width = prompt_len + completion_len
    rollout = rows * (FULL_WIDTH_BYTES * width + COMPLETION_WIDTH_BYTES * completion_len)
    return HostPlan(chips_per_host=chips_per_host, runtime=int(runtime_gib * GIB),
                    staging=chips_per_host * (params_per_chip + optimizer_per_chip),
                    load=num_params * param_bytes, rollout=rollout)
