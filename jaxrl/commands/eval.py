"""`jaxrl eval`: score a checkpoint on a dataset — greedy accuracy, per-reward means, avg@k and pass@k.

    jaxrl eval --checkpoint runs/quickstart --k 8
    jaxrl eval --checkpoint ckpt/qwen3 --config configs/qwen3_0_6b_v5e8.yaml --data my_eval.jsonl --limit 500

The rewards, prompt format (system prompt, chat template) and sampling settings come from `--config`, or, when
`--checkpoint` is a training run directory, from its `config.yaml` (the embedded default otherwise); `--set`
overrides them as in `jaxrl train`. The dataset is the config's held-out split unless `--data` names another
source (a .jsonl/.parquet file, a built-in generator, or `reasoning_gym:<task>`), of which the first `--limit`
records are scored. Evaluation runs the run's own collector (single-turn completions, its environment's
episodes, its multi-agent system's held-out rows) in the training evaluation's batches (`train.eval_batch_size`,
by default `data.prompts_per_step`), so a run's checkpoint
reproduces the training-time `eval/*` numbers of its step. Prints one JSON object (also written to `--out`
when given). A LoRA run's adapters are merged into their base on the fly (`jaxrl.io.lora_io.merged_model`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxrl.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="jaxrl run / checkpoint or HF model directory")
    parser.add_argument("--config", default=None, help="YAML config (default: the run's config.yaml)")
    parser.add_argument("--data", default=None, help="dataset source (default: the config's held-out split)")
    parser.add_argument("--limit", type=int, default=None, help="score the first N records of --data")
    parser.add_argument("--k", type=int, default=1, help="samples per prompt for avg@k / pass@k (1: greedy only)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="prompts per generation call (default: train.eval_batch_size, else "
                             "data.prompts_per_step, as in training)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")


def _config(args):
    from jaxrl.config import load_config

    run_config = Path(args.checkpoint) / "config.yaml"
    path = args.config or (run_config if run_config.is_file() else None)
    return load_config(path, args.set)


def run(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise UserError(f"--k={args.k}: must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit={args.limit}: must be >= 1")
    checkpoint = Path(args.checkpoint)
    if not checkpoint.exists():
        raise UserError(f"--checkpoint {checkpoint}: no such file or directory")
    if args.out is not None and Path(args.out).is_dir():
        raise UserError(f"--out {args.out}: is a directory; give a file path")
    cfg = _config(args)
    from jaxrl import rewards as rewards_lib

    rewards = rewards_lib.resolve(cfg.rewards)  # a bad reward fails before the model is loaded
    from flax import nnx

    from jaxrl.data.pipeline import Encoder, make_splits
    from jaxrl.data.tasks import load_records
    from jaxrl.rl.evaluate import evaluate
    from jaxrl.io.model_io import load_model
    from jaxrl.rl.setup import sampling_spec

    d = cfg.data
    if args.data is None:
        _, records = make_splits(d.source, train_size=d.train_size, eval_size=d.eval_size, seed=d.seed,
                                 params=d.params, prompt_field=d.prompt_field, answer_field=d.answer_field)
    else:
        records = load_records(args.data, args.limit or 64, d.seed, params=d.params, prompt_field=d.prompt_field,
                               answer_field=d.answer_field)
    records = records[: args.limit] if args.limit else records
    if not records:
        raise UserError(f"--data {args.data or d.source}: no records to evaluate")
    from jaxrl.io import lora_io
    from jaxrl.rl.setup import eval_collector

    adapters = lora_io.find_adapters(checkpoint)  # a LoRA run: its adapters merged into the base on the fly
    model, tokenizer = lora_io.merged_model(adapters) if adapters is not None else load_model(checkpoint)
    if tokenizer is None:
        raise UserError(f"--checkpoint {checkpoint}: no tokenizer saved with the model")
    graphdef, params = nnx.split(model)
    # the run's own collector: single-turn completions, its environment's episodes or its multi-agent system
    collector = eval_collector(cfg, graphdef, tokenizer, rewards)
    if args.data is None:  # a system's questions must be over its world (as `jaxrl train` checks them)
        collector.check_records(records, "held-out")
    greedy = sampling_spec(cfg, greedy=True)
    sampled = sampling_spec(cfg, eval_samples=args.k) if args.k > 1 else None
    encoder = Encoder(tokenizer, d.system_prompt, d.target_format, tuple(d.target_formats))
    collect = lambda params, batch, spec, seed: collector(params, batch, spec, seed, train=False)
    batch_size = args.batch_size or cfg.train.eval_batch_size or d.prompts_per_step  # as in training
    out = evaluate(collect, params, records, encoder, greedy, batch_size=batch_size, sampled=sampled,
                   seed=cfg.train.seed)
    out = {"checkpoint": str(checkpoint), "num_prompts": len(records), "k": args.k, **out}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out is not None:
        Path(args.out).write_text(text + "\n")
    return 0
