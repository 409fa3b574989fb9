"""`jaxrl export-hf`: write a jaxrl checkpoint (or a trainer run/step directory) as a Hugging Face directory.

    jaxrl export-hf --checkpoint CKPT --out DIR [--max-shard-size 5GB]
    jaxrl export-hf --checkpoint ADAPTERS --out DIR --merge|--peft [--base BASE]   # LoRA adapter checkpoint

A LoRA run directory stands for its adapters (RUN/adapters), merged by default; a preset base is rebuilt from
the run's config.yaml (`jaxrl.io.lora_io.load_base`).

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
    lora = parser.add_mutually_exclusive_group()  # LoRA: jaxrl.io.lora_io
    lora.add_argument("--merge", action="store_true",
                      help="--checkpoint is a LoRA adapter checkpoint or run: write base + adapters merged "
                           "(the default for a LoRA run)")
    lora.add_argument("--peft", action="store_true",
                      help="--checkpoint is a LoRA adapter checkpoint: write a PEFT adapter directory")
    parser.add_argument("--base", help="base model of the adapters (default: the path recorded with them)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the files a previous export wrote in --out (other files: an error)")


def run(args: argparse.Namespace) -> int:
    from jaxrl.io import hf, lora_io, model_io
    from jaxrl.runtime import run_dir

    if not Path(args.checkpoint).exists():
        raise UserError(f"--checkpoint {args.checkpoint}: no such directory")
    if args.merge or args.peft or lora_io.find_adapters(args.checkpoint) is not None:
        lora_io.export_checkpoint(args.checkpoint, args.out, mode="peft" if args.peft else "merge",
                                  base=args.base, max_shard_size=args.max_shard_size,
                                  overwrite=args.overwrite)
        print(f"wrote {'PEFT adapter' if args.peft else 'merged HF'} directory {args.out}")
        return 0
    if args.base is not None:
        raise UserError("--base applies only with --merge or --peft (a LoRA adapter checkpoint)")
    # Before loading anything: --out must not be a run / checkpoint directory or hold files we do not write.
    run_dir.check_output_dir(args.out, owns=run_dir.owns_hf_export, overwrite=args.overwrite,
                             what="--out")
    model, tokenizer = model_io.load_model_checkpoint(args.checkpoint)
    hf.save_pretrained(model, args.out, tokenizer=tokenizer, max_shard_size=args.max_shard_size,
                       overwrite=args.overwrite)
    print(f"wrote HF directory {args.out}")
    return 0
