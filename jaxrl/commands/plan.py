"""`jaxrl plan CONFIG --devices N [--accelerator v5p]`: per-device memory of a config on its mesh.

Reads these keys of the experiment config (`jaxrl.config.ExperimentConfig`): `model.{preset, hf_path,
checkpoint, overrides, dtype, norm, remat}`, `mesh.*`, `data.prompts_per_step`, `rollout.{group_size,
max_new_tokens, prompt_buckets, gen_buckets}`, `algorithm.{mini_batches, grad_accum, kl.beta}`:

* rollout batch = prompts_per_step · group_size; KV-cache capacity = max(prompt_buckets) + max generation
  length (max(gen_buckets) if set, else max_new_tokens);
* train micro-batch = rollout batch / (mini_batches · grad_accum), of the same length;
* a reference model is held when kl.beta > 0.

Only the model's shapes are needed, never its weights: with `model.hf_path` the HF directory's `config.json`
alone is read; `--hf-config FILE` takes them from a `config.json` anywhere instead (a model not downloaded
yet), and `--set model.hf_path=null --set model.preset=NAME` from a built-in preset.

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
    parser.add_argument("--hf-config", metavar="FILE", default=None,
                        help="HF config.json (or a directory holding one) to take the model shapes from "
                             "instead of the config's model section; no weights are read")
    parser.add_argument("--remat", choices=REMATS, help="override model.remat")
    parser.add_argument("--batch", type=int, help="override the train micro-batch (sequences)")
    parser.add_argument("--seq-len", type=int, help="override the train sequence length")
    parser.add_argument("--rollout-batch", type=int, help="override the rollout batch")
    parser.add_argument("--rollout-len", type=int, help="override the KV-cache capacity")
    parser.add_argument("--logits-chunk", type=int, default=8192,
                        help="vocabulary columns the log-prob computation materialises at once (0: all)")


def model_config(model, hf_config: str | None = None):
    """The TransformerConfig of a `ModelConfig` section (preset / hf_path / checkpoint, then overrides).

    `hf_config`: an HF `config.json` (or its directory) replacing the section's source; the section's
    `overrides`, dtype, norm and remat still apply. Only `config.json` is read, never weights.
    """
    import dataclasses
    import shutil
    import tempfile
    from pathlib import Path

    from jaxrl.build import model_config as resolve

    if hf_config is None:
        if model.hf_path is not None and not (Path(model.hf_path) / "config.json").is_file():
            from jaxrl.build import PRESETS

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
        model_config(cfg.model, args.hf_config), cfg.mesh, args.devices,
        batch=args.batch or micro, seq_len=args.seq_len or seq_len,
        rollout_batch=args.rollout_batch or rollout_batch, rollout_len=args.rollout_len or seq_len,
        remat=args.remat, accelerator=args.accelerator, reference_model=cfg.algorithm.kl.beta > 0,
        logits_chunk=args.logits_chunk or None,
    )
    print(f"batch {args.batch or micro} x {args.seq_len or seq_len} tokens, rollout "
          f"{args.rollout_batch or rollout_batch} x {args.rollout_len or seq_len}, remat "
          f"{args.remat or cfg.model.remat}{', reference model' if cfg.algorithm.kl.beta > 0 else ''}")
    print(plan.table())
    return 0 if plan.fits else 1
