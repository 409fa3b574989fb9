"""`jaxrl export-hf`: write a jaxrl checkpoint (or a trainer run/step directory) as a Hugging Face directory.

    jaxrl export-hf --checkpoint CKPT --out DIR [--max-shard-size 5GB]

Pre-norm models become standard Llama/Qwen2/Qwen3 directories; post-norm and SiameseNorm models carry our own
modeling files and load with `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxrl.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="jaxrl checkpoint, trainer run or step directory")
    parser.add_argument("--out", required=True,
                        help="output HF directory (new or empty; never a run or checkpoint directory)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB, 500MB")
    parser.add_argument("--overwrite", action="store_true", help="replace the files a previous export wrote in --out (any other file there is an error)")


def run(args: argparse.Namespace) -> int:
    from jaxrl import hf, model_io, run_dir

    if not Path(args.checkpoint).exists():
        raise UserError(f"--checkpoint {args.checkpoint}: no such directory")
    # Before loading anything: --out must not be a run / checkpoint directory or hold files we do not write.
    run_dir.check_output_dir(args.out, owns=run_dir.owns_hf_export, overwrite=args.overwrite,
                             what="--out")
    model, tokenizer = model_io.load_model_checkpoint(args.checkpoint)
    hf.save_pretrained(model, args.out, tokenizer=tokenizer, max_shard_size=args.max_shard_size,
                       overwrite=args.overwrite)
    print(f"wrote HF directory {args.out}")
    return 0
