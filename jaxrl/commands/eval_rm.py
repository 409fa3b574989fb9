"""`jaxrl eval-rm CHECKPOINT DATA [--out FILE]`: pairwise accuracy and per-attribute bias statistics.

CHECKPOINT: a train-rm run directory, an RM checkpoint or an HF `*ForSequenceClassification` directory.
DATA: a .jsonl / .parquet file of {prompt, chosen, rejected}, or exactly `synthetic` (the balanced synthetic
eval set; `synthetic:length` / `synthetic:sycophancy` / `synthetic:format` for one planted bias). An existing
file is always read as a file, whatever its name (`synthetic_mine.jsonl` is data, not the built-in set). The
JSON report (see `jaxrl.reward_model.evaluate`) goes to --out, by default RUN/eval_rm_<data name>.json next to
the checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint",
                        help="train-rm run directory, RM checkpoint or HF sequence-classification dir")
    parser.add_argument("data",
                        help="preference pairs (.jsonl / .parquet) or synthetic[:length|sycophancy|format]")
    parser.add_argument("--out", help="output JSON file (default: inside the checkpoint's run directory)")
    parser.add_argument("--max-len", type=int, default=512, help="drop pairs longer than this many tokens")
    parser.add_argument("--size", type=int, default=512, help="number of synthetic pairs")
    parser.add_argument("--batch-size", type=int, default=64)


def run(args: argparse.Namespace) -> int:
    from jaxrl.errors import UserError
    from jaxrl.reward_model import data as data_lib
    from jaxrl.reward_model.evaluate import evaluate_pairs

    if args.max_len < 1:
        raise UserError(f"--max-len={args.max_len}: must be >= 1")
    bias = synthetic_bias(args.data)
    if bias is not None:
        records = data_lib.synthetic_pairs(args.size, 1, chosen_decorated_rate=0.5, bias=bias)
        name = f"synthetic_{bias}"
    else:
        records, name = data_lib.load_pairs(args.data), Path(args.data).stem  # before the model loads
    from jaxrl.rewards.judges.model_reward import load_scorer_model

    model, tokenizer = load_scorer_model(args.checkpoint)
    report = evaluate_pairs(model, data_lib.encode_pairs(records, tokenizer, args.max_len), args.batch_size)
    report.update(checkpoint=str(args.checkpoint), data=str(args.data))
    out = Path(args.out) if args.out else _run_dir(Path(args.checkpoint)) / f"eval_rm_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"accuracy": report["accuracy"], "out": str(out),
                      **{f"{k}_correlation": v["correlation"] for k, v in report["attributes"].items()}}))
    return 0


def synthetic_bias(data: str) -> str | None:
    """The planted bias when DATA names the built-in synthetic set (`synthetic` or `synthetic:BIAS`), else
    None (a file path, even one whose name starts with "synthetic")."""
    if Path(data).exists() or not (data == "synthetic" or data.startswith("synthetic:")):
        return None
    return data.partition(":")[2] or "length"  # checked by `synthetic_pairs` (before the model loads)


def _run_dir(checkpoint: Path) -> Path:
    """RUN for RUN, RUN/checkpoints or RUN/checkpoints/<step>; the directory itself otherwise."""
    if checkpoint.name.isdigit() and checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent
    if checkpoint.name == "checkpoints":
        return checkpoint.parent
    return checkpoint
