"""Where an RL step's time goes: stage clocks, tokens/s per device, MFU of the update, and `--profile` traces.

Every stage is timed on the host between device syncs (`jax.block_until_ready` at the stage's end), so a
stage's seconds are its device work plus its host work, not the time to dispatch it. The keys a step logs
(README, "Where a step's time goes") and their names in NeMo RL and MLPerf Training's RL benchmark:

    time/generation    sampling (single-turn: + detokenising)  NeMo `generation`, MLPerf `generation_time`
    time/reward        scoring the completions                 NeMo `reward_calculation`
    time/env           multi-turn environments' `step` calls   (inside NeMo `generation`)
    time/old_logprobs  the trainer's log-probs of the rollout  NeMo `policy_and_reference_logprobs` (part)
    time/ref_logprobs  the KL reference's log-probs            NeMo `policy_and_reference_logprobs` (part)
    time/teacher_logprobs  on-policy distillation's teacher    (NeMo RL's distillation: `teacher_logprob_inference`)
    time/values        PPO's critic: values of the rollout     verl `timing_s/values`
    time/update        PPO epochs x mini-batches               NeMo `policy_training`, MLPerf
                                                               `policy_training_time`
    time/update_critic PPO's critic: its epochs x mini-batches verl `timing_s/update_critic`
    time/weight_sync   trained weights -> sampler weights      NeMo `prepare_for_generation` / `weight_sync`,
                                                               MLPerf `weight_sync_time`
    time/step          wall time since the previous row        NeMo `total_step_time`, MLPerf
                                                               `train_step_time`

Deviations: trainer and sampler share one copy of the weights (colocated), so `time/weight_sync` is 0 except
under LoRA, where it is the adapter merge; generation is synchronous, so there is no "exposed generation"
(it equals `time/generation`).
"""

from __future__ import annotations

import collections
import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

import jax

from jaxrl.errors import UserError

# The stages a step always reports (0 when the stage did not run).
STAGES = ("generation", "reward", "env", "old_logprobs", "ref_logprobs", "teacher_logprobs", "values", "update",
          "update_critic", "weight_sync")

# Dense bf16 peak FLOP/s of one JAX device, by a lowercase substring of `device.device_kind` (first match
# wins; vendor data sheets, without sparsity). A TPU v4 / v5p chip is one JAX device (megacore).
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),
    ("h200", 989e12),
    ("a100", 312e12),
    ("tpu v4", 275e12),
    ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12),
    ("tpu v5", 459e12),  # v5p reports "TPU v5"
    ("tpu v6", 918e12),  # v6e (Trillium) reports "TPU v6 lite"
)


def peak_flops(device_kind: str) -> float | None:
    """The device's dense bf16 peak FLOP/s, or None when it is not in `PEAK_FLOPS` (CPUs, unknown chips)."""
    kind = device_kind.lower()
    return next((flops for key, flops in PEAK_FLOPS if key in kind), None)


def train_flops_per_token(cfg: Any, context: float, *, lora: bool = False) -> float:
    """Model FLOPs of one token through the update (forward + backward), from a `TransformerConfig`.

    forward = 2 · (Y · (D·N·H·2 + D·K·H·2 + 3·D·F + 2·N·H·context) + D·V): the q/o, k/v, MLP and LM-head
    matmuls and attention over `context` positions (QKᵀ and AV). The backward pass is twice the forward (PaLM,
    arXiv:2204.02311, App. B), once under LoRA (no weight gradients of the frozen base; the adapters' own
    FLOPs are left out). Rematerialisation is not counted (this is MFU, not hardware utilisation).
    """
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    per_layer = 2 * d * n * h + 2 * d * k * h + 3 * d * f + 2 * n * h * context
    forward = 2.0 * (cfg.num_layers * per_layer + d * cfg.vocab_size)
    return forward * (2 if lora else 3)


class StageClock:
    """Seconds and counts of the stages of one step. `with clock("update"): ...` adds the block's wall time to
    the stage (and names it in a `--profile` trace); `clock.add` adds seconds measured elsewhere."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with jax.profiler.TraceAnnotation(stage):
                yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] += seconds


def synced(tree):
    """`tree` once every array in it is computed (a stage boundary)."""
    return jax.block_until_ready(tree)


def parse_profile_steps(text: str) -> tuple[int, int]:
    """`--profile` steps: "3:5" (steps 3 to 5, inclusive) or "4" (step 4 alone) -> (first, last)."""
    parts = text.split(":")
    try:
        first, last = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        first, last = 0, -1
    if not 1 <= first <= last:
        raise UserError(f"--profile {text!r}: expected FIRST:LAST steps (1 <= FIRST <= LAST), e.g. 3:5, "
                        "or one step")
    return first, last


class StepProfiler:
    """A `jax.profiler` trace of training steps first..last into `out_dir` (TensorBoard's profile plugin reads
    the `.xplane.pb`, Perfetto the `perfetto_trace.json.gz`); each step is a `StepTraceAnnotation("train")`
    and each stage a `TraceAnnotation` (`StageClock`). `steps=None`: no trace."""

    def __init__(self, steps: tuple[int, int] | None, out_dir: Path):
        self.steps, self.out_dir, self.active = steps, out_dir, False

    def step(self, step: int) -> contextlib.AbstractContextManager:
        """Starts the trace at the first profiled step; the step's annotation (a no-op outside the range)."""
        if self.steps is None or not self.steps[0] <= step <= self.steps[1]:
            return contextlib.nullcontext()
        if not self.active:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            options = jax.profiler.ProfileOptions()
            # Host Python frames off: they multiply a trace's size (and its export time) several times; the
            # stages still show as host annotations.
            options.python_tracer_level = 0
            jax.profiler.start_trace(str(self.out_dir), create_perfetto_trace=True, profiler_options=options)
            self.active = True
        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def after(self, step: int) -> float | None:
        """Stops (and writes) the trace after its last step: the seconds that took; None when it did not."""
        if self.active and step >= self.steps[1]:
            t0 = time.perf_counter()
            self.close()
            return time.perf_counter() - t0
        return None

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
