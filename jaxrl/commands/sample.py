"""`jaxrl sample`: print completions of prompts from a jaxrl checkpoint or a Hugging Face directory.

    jaxrl sample --checkpoint DIR --prompt "What is 2+3?" --chat --num-samples 4 --max-new-tokens 64

DIR may be a LoRA run directory or adapter checkpoint: the adapters are merged into their base on the fly
(`jaxrl.io.lora_io.merged_model`).

The tokenizer (and chat template) saved with the model are used; `--chat` wraps each prompt as a single user
turn with the generation prompt appended. Generation stops at the tokenizer's EOS token and at the
`eos_token_id`s of `generation_config.json` when the directory has one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxrl.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="jaxrl checkpoint or HF model directory")
    parser.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    parser.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (user turn)")
    parser.add_argument("--num-samples", type=int, default=1, help="completions per prompt (group size G)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)


def encode_prompts(tokenizer, prompts: list[str], chat: bool) -> list[list[int]]:
    """Token ids of each prompt, through the chat template when `chat` is set."""
    if not chat:
        return [list(tokenizer(p, add_special_tokens=True)["input_ids"]) for p in prompts]
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("--chat was given but the tokenizer saved with the model has no chat template")
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def stop_ids(tokenizer, checkpoint: Path) -> tuple[int, ...]:
    """EOS ids: the tokenizer's, plus `eos_token_id` of generation_config.json when present."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = checkpoint / "generation_config.json"
    if gen_cfg.is_file():
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
        ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
    return tuple(sorted(ids))


def run(args: argparse.Namespace) -> int:
    from jaxrl import sampling
    from jaxrl.io.model_io import load_model

    checkpoint = Path(args.checkpoint)
    if not checkpoint.exists():
        raise UserError(f"--checkpoint {checkpoint}: no such file or directory")
    from jaxrl.io import lora_io

    adapters = lora_io.find_adapters(checkpoint)  # a LoRA run: its adapters merged into the base on the fly
    model, tokenizer = lora_io.merged_model(adapters) if adapters is not None else load_model(checkpoint)
    if tokenizer is None:
        raise UserError(f"--checkpoint {checkpoint}: no tokenizer saved with the model")
    prompt_ids = encode_prompts(tokenizer, args.prompt, args.chat)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    try:
        gen = sampling.generate(
            model, prompt_ids, max_new_tokens=args.max_new_tokens, num_samples=args.num_samples,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            eos_ids=stop_ids(tokenizer, checkpoint), seed=args.seed, pad_id=int(pad_id),
        )
    except ValueError as e:
        raise UserError(str(e)) from e
    for row, p in enumerate(gen.prompt_index.tolist()):
        n = int(gen.lengths[row])
        text = tokenizer.decode(gen.tokens[row, :n].tolist(), skip_special_tokens=True)
        end = "eos" if bool(gen.finished[row]) else "max length"
        print(f"=== prompt {p} sample {row % args.num_samples} ({n} tokens, {end}) ===")
        print(text)
    return 0
