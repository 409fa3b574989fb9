"""`jaxrl plan CONFIG --devices N [--accelerator v5p]`: per-device memory of a config on its mesh.

Reads these keys of the experiment config (`jaxrl.config.ExperimentConfig`): `model.{preset, hf_path,
checkpoint, overrides, dtype, norm, remat}`, `mesh.*`, `data.prompts_per_step`, `rollout.{group_size,
max_new_tokens, prompt_buckets, gen_buckets}`, `algorithm.{mini_batches, grad_accum, kl_beta}`:

* rollout batch = prompts_per_step · group_size; KV-cache capacity = max(prompt_buckets) + max generation
  length (max(gen_buckets) if set, else max_new_tokens);
* train micro-batch = rollout batch / (mini_batches · grad_accum), of the same length;
* a reference model is held when kl_beta > 0.

Exit code 0 when the peak fits the accelerator's HBM, 1 when it does not.
"""

from __future__ import annotations

import argparse

from jaxrl.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl.plan import HBM_GIB, REMATS

    parser.add_argument("config", help="experiment YAML")
    parser.add_argument("--devices", type=int, required=True, help="number of accelerator devices (chips)")
    parser.add_argument("--accelerator", default="v5p", choices=sorted(HBM_GIB), help="HBM per device")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--remat", choices=REMATS, help="override model.remat")
    parser.add_argument("--batch", type=int, help="override the train micro-batch (sequences)")
    parser.add_argument("--seq-len", type=int, help="override the train sequence length")
    parser.add_argument("--rollout-batch", type=int, help="override the rollout batch")
    parser.add_argument("--rollout-len", type=int, help="override the KV-cache capacity")
    parser.add_argument("--logits-chunk", type=int, default=8192,
                        help="vocabulary columns the log-prob computation materialises at once (0: all)")


def model_config(model):
    """The TransformerConfig of a `ModelConfig` section (preset / hf_path / checkpoint, then overrides)."""
    from jaxrl.build import model_config as resolve

    return resolve(model)


def run(args: argparse.Namespace) -> int:
    from jaxrl.config import load_config
    from jaxrl.plan import plan_memory

    if args.devices < 1:
        raise ConfigError(f"--devices={args.devices}: must be >= 1")
    cfg = load_config(args.config, args.set)
    rollout_batch = cfg.data.prompts_per_step * cfg.rollout.group_size
    gen = max(cfg.rollout.gen_buckets) if cfg.rollout.gen_buckets else cfg.rollout.max_new_tokens
    seq_len = max(cfg.rollout.prompt_buckets) + gen
    micro = rollout_batch // (cfg.algorithm.mini_batches * cfg.algorithm.grad_accum)
    plan = plan_memory(
        model_config(cfg.model), cfg.mesh, args.devices,
        batch=args.batch or micro, seq_len=args.seq_len or seq_len,
        rollout_batch=args.rollout_batch or rollout_batch, rollout_len=args.rollout_len or seq_len,
        remat=args.remat, accelerator=args.accelerator, reference_model=cfg.algorithm.kl_beta > 0,
        logits_chunk=args.logits_chunk or None,
    )
    print(f"batch {args.batch or micro} x {args.seq_len or seq_len} tokens, rollout "
          f"{args.rollout_batch or rollout_batch} x {args.rollout_len or seq_len}, remat "
          f"{args.remat or cfg.model.remat}{', reference model' if cfg.algorithm.kl_beta > 0 else ''}")
    print(plan.table())
    return 0 if plan.fits else 1
