"""`jaxrl plan CONFIG --devices N [--accelerator v5p]`: per-device memory of a config on its mesh.

Reads these keys of the experiment config (`jaxrl.config.ExperimentConfig`): `model.{preset, hf_path,
checkpoint, overrides, dtype, norm, remat}`, `mesh.*`, `data.prompts_per_step`, `rollout.{group_size,
max_new_tokens, prompt_buckets, gen_buckets}`, `algorithm.{mini_batches, grad_accum, kl.beta}`,
`model.{lora, quantize}`:

* rollout batch = prompts_per_step · group_size; KV-cache capacity = max(prompt_buckets) + max generation
  length (max(gen_buckets) if set, else max_new_tokens);
* train micro-batch = rollout batch / (mini_batches · grad_accum), of the same length;
* a reference model is held when kl.beta > 0 (never with LoRA: the reference is the frozen base itself);
* with `model.lora` the parameters, optimizer and gradient rows are those of `lora_plan` (adapters only in
  the optimizer, the base at its quantised size with `model.quantize`).

Only the model's shapes are needed, never its weights: with `model.hf_path` the HF directory's `config.json`
alone is read; `--hf-config FILE` takes them from a `config.json` anywhere instead (a model not downloaded
yet), and `--set model.hf_path=null --set model.preset=NAME` from a built-in preset.

`--compile` also lowers and compiles the run's train step, log-prob pass and sampler at these shapes on `--devices`
fake CPU devices from abstract weights and prints XLA's per-device memory, FLOPs and collectives per program
(`jaxrl.plan.compiled`), with the analytic peak beside; a compiled program over the HBM, or XLA's "Involuntary
full rematerialization" (a tensor replicated because it could not be resharded), exits 2 with one line.

Exit code 0 when the peak fits the accelerator's HBM, 1 when it does not.
"""

from __future__ import annotations

import argparse
import math

from jaxrl.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl.plan.memory import HBM_GIB, REMATS

    parser.add_argument("config", help="experiment YAML")
    parser.add_argument("--devices", type=int, required=True, help="number of accelerator devices (chips)")
    parser.add_argument("--accelerator", default="v5p", choices=sorted(HBM_GIB), help="HBM per device")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--hf-config", metavar="FILE", default=None,
                        help="HF config.json (or a directory holding one) to take the model shapes from "
                             "instead of the config's model section; no weights are read")
    parser.add_argument("--chips-per-host", type=int, default=4,
                        help="devices attached to one host, for the per-host RAM table (4 on TPU pod VMs)")
    parser.add_argument("--remat", choices=REMATS, help="override model.remat")
    parser.add_argument("--batch", type=int, help="override the train micro-batch (sequences)")
    parser.add_argument("--seq-len", type=int, help="override the train sequence length")
    parser.add_argument("--rollout-batch", type=int, help="override the rollout batch")
    parser.add_argument("--rollout-len", type=int, help="override the KV-cache capacity")
    parser.add_argument("--logits-chunk", type=int, default=8192,
                        help="vocabulary columns the log-prob computation materialises at once (0: all)")
    parser.add_argument("--compile", action="store_true",
                        help="also lower and compile the train step, log-prob pass and sampler at these shapes on "
                             "--devices fake CPU devices (abstract weights) and print XLA's per-device "
                             "memory, "
                             "FLOPs and collectives (jaxrl.plan.compiled)")


def model_config(model, hf_config: str | None = None):
    """The TransformerConfig of a `ModelConfig` section (preset / hf_path / checkpoint, then overrides).

    `hf_config`: an HF `config.json` (or its directory) replacing the section's source; the section's
    `overrides`, dtype, norm and remat still apply. Only `config.json` is read, never weights.
    """
    import dataclasses
    import shutil
    import tempfile
    from pathlib import Path

    from jaxrl.io.build import model_config as resolve

    if hf_config is None:
        if model.hf_path is not None and not (Path(model.hf_path) / "config.json").is_file():
            from jaxrl.io.build import PRESETS

            raise ConfigError(
                f"model.hf_path: no config.json in {model.hf_path} (plan reads only that file, no weights); "
                f"pass --hf-config CONFIG_JSON, or --set model.hf_path=null --set model.preset=NAME with "
                f"NAME one of {', '.join(sorted(PRESETS))}")
        return resolve(model)
    path = Path(hf_config).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"--hf-config {hf_config}: no such file (expected an HF config.json or its "
                          "directory)")
    with tempfile.TemporaryDirectory() as tmp:  # build.model_config reads DIR/config.json
        shutil.copyfile(file, Path(tmp) / "config.json")
        section = dataclasses.replace(model, preset=None, hf_path=tmp, checkpoint=None)
        try:
            return resolve(section)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"--hf-config {hf_config}: not a supported HF model config ({e})") from None


def _local_elements(shape: tuple, names: tuple, sizes: dict[str, int], rules) -> int:
    """Elements of one array a device holds when `names` are placed with `rules` on mesh axis `sizes`."""
    from jaxrl.sharding import logical_to_spec
    from jaxrl.sharding.rules import spec_axes

    spec = logical_to_spec(names, rules)
    return math.prod(n // math.prod(sizes[a] for a in spec_axes(e)) for n, e in zip(shape, spec))


def lora_plan(plan, model_cfg, lora_cfg, quantize: str, mesh_cfg, num_devices: int):
    """(Plan, breakdown) of a LoRA / QLoRA run, from `plan`: the dense plan of the same run, no reference.

    Per device (bytes), every array sharded by the trainer's rule tables (`jaxrl.sharding.lora`: A takes its
    kernel's input axis names, B its output names, the rank axis is never split):

    * params     base + adapters + merged. base: `plan.params`, with the seven projection kernels at
                 `quant.quantized_bytes` when quantised (int8: 1 byte + a float32 scale per output row; nf4:
                 ½ byte + a float32 absmax per 64 inputs; per device in the dense kernel's proportion,
                 exact for the codes, approximate for the float32 scales). adapters: float32,
                 Σ_targets Y·r·(in + out). merged: W′ = W + (α/r)·A·B of the targets in param_dtype (of all
                 seven projections for a quantised base, which `lora.merge` dequantises); it lives through
                 the rollout (the policy is merged once per step) and the train step (`lora.lora_memory`).
    * optimizer  AdamW's two float32 moments of the adapters only: 2 · adapters.
    * gradients  ∂L/∂A, ∂L/∂B (float32, like the adapters) + ∂L/∂W′ of the targets (param_dtype).

    No reference copy: the KL reference is the base without adapters. Activations and KV cache: as dense.
    """
    import dataclasses

    import jax.numpy as jnp

    from jaxrl.models import lora, quant
    from jaxrl.sharding import AXES, RULES

    sizes = dict(zip(AXES, mesh_cfg.shape(num_devices)))
    rules = RULES[mesh_cfg.rules]
    width = jnp.dtype(model_cfg.param_dtype).itemsize
    dense = {}  # target -> (per-device kernel elements, all elements, torch [out, in] shape of one layer)
    for target in lora.TARGETS:
        shape, names = lora.kernel_shape_and_names(model_cfg, target)
        num_in = lora.SITES[target][1]
        hf_shape = (math.prod(shape[1 + num_in:]), math.prod(shape[1:1 + num_in]))
        dense[target] = (_local_elements(shape, names, sizes, rules), math.prod(shape), hf_shape)
    base = plan.params
    if quantize != "none":
        for local, total, hf_shape in dense.values():
            stored = model_cfg.num_layers * quant.quantized_bytes(hf_shape, quantize)
            base += stored * local // total - local * width
    adapters = 0
    for target in lora_cfg.targets:
        a_names, b_names = lora.adapter_logical_names(target)
        for shape, names in zip(lora.adapter_shapes(model_cfg, target, lora_cfg.rank), (a_names, b_names)):
            adapters += 4 * _local_elements(shape, names, sizes, rules)
    merged_targets = lora.TARGETS if quantize != "none" else lora_cfg.targets
    merged = sum(dense[t][0] for t in merged_targets) * width
    cotangent = sum(dense[t][0] for t in lora_cfg.targets) * width
    parts = {"base": base, "adapters": adapters, "merged": merged, "merged_cotangent": cotangent}
    out = dataclasses.replace(plan, params=base + adapters + merged, optimizer=2 * adapters,
                              gradients=adapters + cotangent)
    return out, parts


def run(args: argparse.Namespace) -> int:
    from jaxrl.config import load_config
    from jaxrl.plan.memory import GIB, plan_memory

    if args.devices < 1:
        raise ConfigError(f"--devices={args.devices}: must be >= 1")
    if args.compile:  # before any JAX backend exists: N fake CPU devices
        _fake_devices(args.devices)
    cfg = load_config(args.config, args.set)
    rollout_batch = cfg.data.prompts_per_step * cfg.rollout.group_size
    gen = max(cfg.rollout.gen_buckets) if cfg.rollout.gen_buckets else cfg.rollout.max_new_tokens
    seq_len = max(cfg.rollout.prompt_buckets) + gen
    micro = rollout_batch // (cfg.algorithm.mini_batches * cfg.algorithm.grad_accum)
    lora_cfg = cfg.model.lora
    reference = cfg.algorithm.kl.beta > 0 and lora_cfg is None  # LoRA's reference is the base: no copy
    model_cfg = model_config(cfg.model, args.hf_config)
    plan = plan_memory(
        model_cfg, cfg.mesh, args.devices,
        batch=args.batch or micro, seq_len=args.seq_len or seq_len,
        rollout_batch=args.rollout_batch or rollout_batch, rollout_len=args.rollout_len or seq_len,
        remat=args.remat, accelerator=args.accelerator, reference_model=reference,
        logits_chunk=args.logits_chunk or None,
    )
    print(f"batch {args.batch or micro} x {args.seq_len or seq_len} tokens, rollout "
          f"{args.rollout_batch or rollout_batch} x {args.rollout_len or seq_len}, remat "
          f"{args.remat or cfg.model.remat}{', reference model' if reference else ''}")
    if lora_cfg is not None:
        plan, parts = lora_plan(plan, model_cfg, lora_cfg, cfg.model.quantize, cfg.mesh, args.devices)
        base = "" if cfg.model.quantize == "none" else f" ({cfg.model.quantize})"
        print(f"LoRA r={lora_cfg.rank} on {', '.join(lora_cfg.targets)}; the KL reference is the base. "
              f"params = base{base} {parts['base'] / GIB:.3f} + adapters {parts['adapters'] / GIB:.3f} + "
              f"merged W' {parts['merged'] / GIB:.3f} GiB; gradients include dL/dW' "
              f"{parts['merged_cotangent'] / GIB:.3f} GiB")
    print(plan.table())
    print(_host_plan(cfg, plan, parts["adapters"] if lora_cfg is not None else plan.params, model_cfg,
                     min(args.chips_per_host, args.devices), rollout_rows=args.rollout_batch or rollout_batch,
                     completion_len=gen).table())
    if args.compile:
        _compile(cfg, model_cfg, plan, args.devices)
    return 0 if plan.fits else 1


_REMAT_WARNING = "Involuntary full rematerialization"


def _fake_devices(n: int) -> None:
    """Asks for `n` fake CPU devices; refused if this process already started JAX with another count."""
    import os
    import re

    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


def _compile(cfg, model_cfg, plan, devices: int) -> None:
    """Compiles the run's programs (`jaxrl.plan.compiled`) and prints their table; a program over the HBM, or
    a compile that replicated a tensor it could not reshard, is a ConfigError (exit 2)."""
    import jax

    from jaxrl.plan import compiled as plan_compile
    from jaxrl.plan.memory import GIB
    from jaxrl.sharding import RULES, make_mesh

    if len(jax.devices()) != devices:
        raise ConfigError(f"--compile --devices={devices}: this process already runs JAX on "
                          f"{len(jax.devices())} devices; run jaxrl plan in a fresh process")
    with plan_compile.captured_stderr() as log:
        reports = plan_compile.compile_programs(cfg, model_cfg, make_mesh(cfg.mesh), RULES[cfg.mesh.rules])
    print(plan_compile.table(reports, plan.peak))
    remat = [line for line in log() if _REMAT_WARNING in line]
    if remat:
        raise ConfigError(f"--compile: XLA replicated a tensor it could not reshard ({len(remat)} x "
                          f"'{_REMAT_WARNING}'; first: {remat[0].strip()[:300]})")
    over = [r for r in reports if r.accelerator_total > plan.hbm]  # XLA:CPU's f32 copies of bf16 arrays left out
    if over:
        raise ConfigError(f"--compile: {over[0].name} needs {over[0].accelerator_total / GIB:.2f} GiB per device, "
                          f"over the {plan.hbm / GIB:.0f} GiB of HBM of {plan.accelerator}")


def _host_plan(cfg, plan, checkpointed_params: int, model_cfg, chips_per_host: int, *, rollout_rows: int,
               completion_len: int):
    """`jaxrl.plan.host.plan_host` of this run: what one host's RAM holds (the checkpoint stages the trained
    parameters, i.e. the adapters alone under LoRA, and their AdamW moments; the initial load reads the whole
    model in its stored dtype; every host holds the whole rollout batch)."""
    import jax.numpy as jnp

    from jaxrl.plan.host import plan_host

    if chips_per_host < 1:
        raise ConfigError(f"--chips-per-host={chips_per_host}: must be >= 1")
    from jaxrl.rl.setup import algo_settings

    dapo = algo_settings(cfg).params.max_tries if cfg.algorithm.name == "dapo" else 0
    return plan_host(params_per_chip=checkpointed_params, optimizer_per_chip=plan.optimizer,
                     chips_per_host=chips_per_host, num_params=plan.num_params,
                     param_bytes=jnp.dtype(model_cfg.param_dtype).itemsize, rollout_rows=rollout_rows,
                     prompt_len=max(cfg.rollout.prompt_buckets), completion_len=completion_len,
                     resample_rounds=dapo)
