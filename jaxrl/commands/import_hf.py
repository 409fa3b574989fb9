"""`jaxrl import-hf`: convert a Hugging Face directory (or a GGUF file) into a jaxrl model checkpoint.

    jaxrl import-hf --hf DIR --out CKPT [--dtype bfloat16]
    jaxrl import-hf --gguf FILE.gguf --out CKPT        # dequantises to a temporary HF directory first
    jaxrl import-hf --peft ADAPTER --hf BASE --out DIR  # PEFT LoRA adapter -> jaxrl adapter checkpoint

The checkpoint holds `model_config.json`, the orbax `params/` item and the tokenizer when the source has one.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from jaxrl.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", help="HF model directory (config.json + safetensors)")
    source.add_argument("--gguf", help="GGUF file (llama/qwen2/qwen3; needs torch, gguf, accelerate)")
    parser.add_argument("--peft", help="PEFT LoRA adapter directory trained on the --hf base: writes a jaxrl "
                                       "LoRA adapter checkpoint (float32 adapters + base path and hash)")
    parser.add_argument("--out", required=True,
                        help="output jaxrl checkpoint directory (new or empty; never a run directory)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="parameter dtype")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace model_config.json, params/, tokenizer/ of a previous import in --out")


def _import_dir(hf_dir: Path, args: argparse.Namespace) -> None:
    from jaxrl.io import hf, model_io

    model = hf.from_pretrained(hf_dir, dtype=args.dtype)
    model_io.save_model_checkpoint(model, args.out, tokenizer=model_io.load_tokenizer(hf_dir),
                                   overwrite=args.overwrite)


def _import_peft(args: argparse.Namespace) -> int:
    from jaxrl.io import lora_io

    if args.hf is None:
        raise UserError("--peft needs --hf BASE (the HF directory the adapter was trained on)")
    if not Path(args.hf).is_dir():
        raise UserError(f"--hf {args.hf}: not a directory")
    for note in lora_io.import_peft_checkpoint(args.peft, args.hf, args.out, overwrite=args.overwrite):
        print(f"note: {note}")
    print(f"wrote jaxrl LoRA adapter checkpoint {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.peft is not None:
        return _import_peft(args)
    from jaxrl.runtime import run_dir

    # Before loading any model: --out must be new, empty, or (with --overwrite) a previous import.
    run_dir.check_output_dir(args.out, owns=run_dir.owns_model_checkpoint, overwrite=args.overwrite,
                             what="--out")
    if args.gguf is not None:
        from jaxrl.io.gguf import gguf_to_hf_dir

        with tempfile.TemporaryDirectory(prefix="jaxrl-gguf-") as tmp:
            hf_dir = gguf_to_hf_dir(args.gguf, Path(tmp) / "hf", dtype="float32")
            _import_dir(hf_dir, args)
    else:
        if not Path(args.hf).is_dir():
            raise UserError(f"--hf {args.hf}: not a directory")
        _import_dir(Path(args.hf), args)
    print(f"wrote jaxrl checkpoint {args.out}")
    return 0
