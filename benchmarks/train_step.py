"""Tokens/s of one GRPO update: jaxrl's jitted train step vs TRL's GRPOTrainer loss + AdamW step (torch CPU).

    .venv/bin/python benchmarks/train_step.py [--batch 16] [--prompt 32] [--completion 96] [--group 1]
        [--steps 5] [--rounds 1] [--shape tiny|smollm2]

Same model (a Llama-architecture transformer written once with `jaxrl.io.hf.save_pretrained` and loaded by both
sides), same batch (B rows of prompt + completion tokens, random advantages, old log-probs, masks), same loss
(token-mean clipped surrogate, ε = 0.2, β = 0: TRL `loss_type="bnpo"`), same optimiser (AdamW, clip norm 1).
With `--group G` > 1 the batch is GRPO-shaped: G consecutive rows share one prompt (same tokens, same left
padding), and both sides receive that identical batch; jaxrl's sides mark it (`TrainBatch.group = G`) and run
each prompt once per group (`Transformer.forward_groups`), as the trainer does, while TRL computes it
unshared, as it does in practice; the `unshared` side is jaxrl's default step on the same batch with
`group = 1`. `--group 1` (default) is the earlier benchmark: every row its own prompt.
Each side runs in its own child process so that its peak host memory (ru_maxrss) is its own; the update is
timed after one warm-up (compile) call, median of `--steps` calls; tokens/s counts all B·L batch tokens.
jaxrl runs twice: with the default scanned layer loop and with `scan_layers=False` (the layers unrolled).
With `--rounds R` the three sides run round-robin R times (jaxrl, unrolled, TRL, jaxrl, ...) and each side
reports its best round, so a CPU shared with other work slows every side alike. `--shape smollm2` uses the
SmolLM2-135M shape (random weights) instead of the small benchmark model, to compare peak RSS at a real size.
`--sides` picks the sides (default jaxrl,unrolled,trl); `lora`, `qlora-int8` and `qlora-nf4` add jaxrl's
scanned step training LoRA adapters (r = `--lora-rank`, α = 2r, all seven projections, as `model.lora`)
over a dense float32 base or an int8 / nf4 quantised one (`model.quantize`); the optimiser then holds the
adapters only. Each side's peak RSS includes loading the float32 model (a QLoRA base is quantised from it, as
the trainer does).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

MODEL = dict(vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32,
             mlp_dim=768, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=512, family="llama",
             tie_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
SHAPES = {"tiny": MODEL,
          "smollm2": dict(MODEL, vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                          head_dim=64, mlp_dim=1536, rope_theta=100000.0, rms_norm_eps=1e-5,
                          max_position_embeddings=8192, tie_embeddings=True)}


def attention_weight(shape: str) -> float:
    """`train.packing: auto`'s attention weight of the `shape` model, as the trainer derives it."""
    from jaxrl.models import TransformerConfig
    from jaxrl.rl.unpadding import attention_weight_of

    return attention_weight_of(TransformerConfig(**SHAPES[shape]))


def make_inputs(b: int, lp: int, lc: int, seed: int = 0, group: int = 1, lengths: str = "uniform"
                ) -> dict[str, np.ndarray]:
    """Random rows: prompts of lp//2 .. lp tokens, left-padded (one prompt per `group` consecutive rows),
    completions of lc//2 .. lc tokens (`lengths` "uniform"), or of min(lc, ⌊16 / U⌋) tokens, U ~ Uniform(0, 1]
    ("long-tailed": the law of benchmarks/continuous.py, median 32, a few rows at lc)."""
    rng = np.random.default_rng(seed)
    if b % group:
        raise ValueError(f"--batch {b} is not a multiple of --group {group}")
    p = b // group
    prompt = np.repeat(rng.integers(3, MODEL["vocab_size"], size=(p, lp)), group, axis=0)
    plen = np.repeat(rng.integers(lp // 2, lp + 1, size=p), group)
    pmask = np.arange(lp)[None, :] >= lp - plen[:, None]  # left padding
    comp = rng.integers(3, MODEL["vocab_size"], size=(b, lc))
    clen = rng.integers(lc // 2, lc + 1, size=b)
    if lengths == "long-tailed":
        from continuous import long_tailed_lengths  # benchmarks/continuous.py

        clen = np.maximum(long_tailed_lengths(b, 16, lc, seed=seed + 1), 1)
    cmask = np.arange(lc)[None, :] < clen[:, None]
    return dict(prompt_ids=np.where(pmask, prompt, 0), prompt_mask=pmask,
                completion_ids=np.where(cmask, comp, 0), completion_mask=cmask,
                advantages=rng.normal(size=b).astype(np.float32),
                old_logp=np.where(cmask, -rng.uniform(6.0, 9.0, size=(b, lc)), 0.0).astype(np.float32))


def jaxrl_update(graphdef, params, x: dict[str, np.ndarray], *, group: int = 1, spec=None, extra_options=None):
    """(jitted step, initial TrainState, TrainBatch on the default device) of jaxrl's update on the rows
    `x` of `make_inputs`, jitted as the trainer does (donated state, `cpu_compile.cpu_jit` with YNNPACK's dot
    fusion, plus the XLA:CPU `extra_options`); AdamW with clip norm 1. `group` > 1 marks shared-prompt groups (`TrainBatch.group`);
    `spec`: a `LossSpec`."""
    import functools

    import jax
    import jax.numpy as jnp
    import optax

    from jaxrl.learner.cpu_compile import YNN_DOT, cpu_jit
    from jaxrl.learner.train_step import LossSpec, TrainBatch, TrainState, train_step

    spec = LossSpec() if spec is None else spec
    tokens = np.concatenate([x["prompt_ids"], x["completion_ids"]], 1).astype(np.int32)
    mask = np.concatenate([x["prompt_mask"], x["completion_mask"]], 1)
    completion_BT = x["completion_mask"]  # completion space: the loss reads only these positions
    old_BT = x["old_logp"].astype(np.float32)
    adv_BT = completion_BT * x["advantages"][:, None]
    b = tokens.shape[0]
    clip_B = np.full((b,), 0.2, np.float32)
    batch = TrainBatch(tokens, mask, completion_BT, old_BT, np.zeros_like(old_BT), adv_BT.astype(np.float32),
                       clip_B, clip_B, np.zeros((b,), np.float32), group=group)
    batch = jax.device_put(batch)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
    step = cpu_jit(functools.partial(train_step, graphdef=graphdef, spec=spec, tx=tx), donate_argnums=0,
                   fast=dict(YNN_DOT, **(extra_options or {})))  # as the trainer
    return step, TrainState(params, tx.init(params), jnp.zeros((), jnp.int32)), batch


def time_update(step, state, batch, base, steps: int):
    """(state, metrics, seconds of the first (compiling) call, seconds of each of `steps` further calls)."""
    import jax

    t0 = time.perf_counter()
    state, m = step(state, batch, base)
    jax.block_until_ready(m["loss"])
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = step(state, batch, base)
        jax.block_until_ready((state.params, m["loss"]))
        times.append(time.perf_counter() - t0)
    return state, m, first_s, times


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_jaxrl(model_dir: str, args, out) -> None:
    from jaxrl.runtime import host_memory

    host_memory.configure_from_env()  # what the `jaxrl` CLI does before importing jax
    import jax
    from flax import nnx

    from jaxrl.io import hf
    from jaxrl.learner.train_step import LossSpec

    model = hf.from_pretrained(model_dir)
    # what `model.scan_layers` / `model.remat` in a config do
    model.cfg = model.cfg.replace(scan_layers=args.scan_layers, remat=getattr(args, "remat", "none"))
    graphdef, params = nnx.split(model)
    params = params.to_pure_dict()
    del model
    spec, base = LossSpec(), None
    if args.lora != "none":  # as `jaxrl.rl.setup._lora_setup`: train adapters over a frozen (quantised) base
        from jaxrl.models import lora, quant

        lora_cfg = lora.LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        adapters = lora.init_adapters(params, lora_cfg, jax.random.key(3))
        base = params if args.lora == "dense" else quant.quantize_params(params, args.lora)
        params, spec = adapters, LossSpec(lora=lora_cfg)
    x = make_inputs(args.batch, args.prompt, args.completion, group=args.group, lengths=args.lengths)
    step, state, batch = jaxrl_update(graphdef, params, x, group=args.group if args.shared else 1, spec=spec)
    del params
    packed = {}
    if args.packed:  # `train.packing: auto` on one device: packed rows where they compute fewer positions
        from jaxrl.config import MeshConfig
        from jaxrl.rl import packing
        from jaxrl.sharding import RULES, make_mesh

        mesh = make_mesh(MeshConfig(data=1, fsdp=1), jax.devices()[:1])
        weight = attention_weight(args.shape)
        packed_batch, packed = packing.packer_for("auto", mesh, RULES["fsdp"], 1, attention_weight=weight)(batch)
        if packed["train/packed"]:  # placed like the unpacked batch (uncommitted): one program for every call
            batch = jax.device_put(jax.device_get(packed_batch))
    state, m, compile_s, times = time_update(step, state, batch, base, args.steps)
    out.put(dict(side=args.side, step_s=statistics.median(times), **packed,
                 first_call_s=compile_s,
                 loss=float(m["loss"]), peak_rss_mib=_peak_rss_mib(), step_cache_size=step._cache_size()))


def run_trl(model_dir: str, args, out) -> None:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = PreTrainedTokenizerFast(tokenizer_object=_tiny_tokenizer(), pad_token="<pad>", eos_token="<eos>")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(output_dir=tmp, use_cpu=True, bf16=False, report_to=[], loss_type="bnpo", beta=0.0,
                         epsilon=0.2, num_generations=2, per_device_train_batch_size=2,
                         max_completion_length=args.completion, logging_steps=1000)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=cfg, train_dataset=datasets.Dataset.from_dict({"prompt": ["a"] * 4}),
                              processing_class=tok)
        x = make_inputs(args.batch, args.prompt, args.completion, group=args.group, lengths=args.lengths)
        t = {k: torch.as_tensor(v) for k, v in x.items()}
        inputs = dict(prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"].long(),
                      completion_ids=t["completion_ids"], completion_mask=t["completion_mask"].long(),
                      advantages=t["advantages"], old_per_token_logps=t["old_logp"],
                      num_items_in_batch=torch.as_tensor(float(x["completion_mask"].sum())))
        trainer.current_gradient_accumulation_steps = 1  # normally set by Trainer.train's loop
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        if args.checkpointing:  # what `Trainer.train` does with GRPOConfig's default, activation_checkpointing=True
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=cfg.activation_checkpointing_kwargs)
        model.train()

        def update():
            loss = trainer._compute_loss(model, inputs)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        t0 = time.perf_counter()
        update()
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = update()
            times.append(time.perf_counter() - t0)
    out.put(dict(side=args.side, step_s=statistics.median(times), first_call_s=first, loss=loss,
                 peak_rss_mib=_peak_rss_mib(), torch_threads=torch.get_num_threads()))


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{chr(97 + i): 3 + i for i in range(26)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return t


def _child(fn, model_dir, args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(model_dir, args, q))
    p.start()
    while True:
        try:
            return q.get(timeout=1.0)
        except Exception:  # noqa: BLE001 -- queue.Empty: check the child is still alive
            if not p.is_alive():  # e.g. killed by the OOM killer (-9): report it, keep the other sides
                print(f"{fn.__name__} exited with code {p.exitcode} without a result", file=sys.stderr)
                return dict(side=fn.__name__, error=f"exit code {p.exitcode}", step_s=float("inf"),
                            peak_rss_mib=float("nan"), loss=float("nan"), first_call_s=float("nan"))


def _best(results: list[dict]) -> dict:
    """The round with the fastest update; peak RSS is the largest seen in any round, the other step times kept."""
    best = dict(min(results, key=lambda r: r["step_s"]))
    best["peak_rss_mib"] = max((r["peak_rss_mib"] for r in results if "error" not in r), default=float("nan"))
    best["round_step_s"] = [r["step_s"] for r in results]
    return best


# side -> (child function, extra arguments); KEYS: the side's key in the JSON report; NAMES: its printed name.
# Every jaxrl side shares prompts within groups (`--group` > 1) except `unshared`.
_J = dict(lora="none", shared=True, packed=False)
SIDES = {"jaxrl": (run_jaxrl, dict(_J, scan_layers=True)),
         "packed": (run_jaxrl, dict(_J, scan_layers=True, packed=True)),
         "unshared": (run_jaxrl, dict(_J, scan_layers=True, shared=False)),
         "unrolled": (run_jaxrl, dict(_J, scan_layers=False)),
         "trl": (run_trl, dict(checkpointing=False)),
         "trl-ckpt": (run_trl, dict(checkpointing=True)),
         "lora": (run_jaxrl, dict(_J, scan_layers=True, lora="dense")),
         "qlora-int8": (run_jaxrl, dict(_J, scan_layers=True, lora="int8")),
         "qlora-nf4": (run_jaxrl, dict(_J, scan_layers=True, lora="nf4"))}
KEYS = {"packed": "jaxrl_packed", "unshared": "jaxrl_unshared", "unrolled": "jaxrl_unrolled",
        "trl-ckpt": "trl_ckpt", "lora": "jaxrl_lora", "qlora-int8": "jaxrl_qlora_int8", "qlora-nf4": "jaxrl_qlora_nf4"}
NAMES = {"jaxrl": "jaxrl (scan_layers=true, default)", "packed": "jaxrl (train.packing: auto)",
         "unshared": "jaxrl (prompts not shared)", "unrolled": "jaxrl (scan_layers=false)", "trl": "TRL",
         "trl-ckpt": "TRL (activation checkpointing)", "lora": "jaxrl LoRA r={rank}",
         "qlora-int8": "jaxrl QLoRA int8 r={rank}", "qlora-nf4": "jaxrl QLoRA nf4 r={rank}"}
# `model.remat` policies, on the padded / shared-prompt update ("remat-P") or on `train.packing: auto`'s
# ("packed-remat-P": packed or unpadded where the packer packs, as a config setting both runs)
# the policies in the order a grid tries them: least recompute first
REMAT_POLICIES = ("mlp", "attention", "dots", "full")
for _policy in REMAT_POLICIES:
    for _packed in (False, True):
        _side = ("packed-" if _packed else "") + f"remat-{_policy}"
        SIDES[_side] = (run_jaxrl, dict(_J, scan_layers=True, packed=_packed, remat=_policy))
        KEYS[_side] = "jaxrl_" + _side.replace("-", "_")
        NAMES[_side] = f"jaxrl ({'train.packing: auto, ' if _packed else ''}model.remat: {_policy})"


def parse(argv=None) -> argparse.Namespace:
    """The command line's settings (`main`; `benchmarks/update_grid.py` builds them per grid point)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--completion", type=int, default=96)
    ap.add_argument("--group", type=int, default=1, help="G consecutive rows share one prompt (GRPO groups)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="round-robin repeats; each side reports its best")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--sides", default="jaxrl,unrolled,trl", help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument("--lora-rank", type=int, default=16, help="adapter rank of the lora / qlora sides")
    ap.add_argument("--lengths", choices=("uniform", "long-tailed"), default="uniform",
                    help="completion lengths: lc/2..lc, or long-tailed 16..lc (`make_inputs`)")
    args = ap.parse_args(argv)
    sides = args.sides.split(",")
    if not sides or any(side not in SIDES for side in sides):
        ap.error(f"--sides {args.sides}: choose among {', '.join(SIDES)}")
    return args


def measure(args: argparse.Namespace) -> dict:
    """The JSON report of one shape: every side's best round (`_best`), tokens/s, and the ratios to TRL."""
    sides = args.sides.split(",")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from flax import nnx

    from jaxrl.io import hf
    from jaxrl.models import Transformer, TransformerConfig

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        shape = dict(SHAPES[args.shape])
        shape["max_position_embeddings"] = max(shape["max_position_embeddings"], args.prompt + args.completion)
        hf.save_pretrained(Transformer(TransformerConfig(**shape), rngs=nnx.Rngs(0)), model_dir)
        rounds: dict[str, list[dict]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side in sides:
                fn, extra = SIDES[side]
                side_args = argparse.Namespace(**vars(args), side=side, **extra)
                rounds[side].append(_child(fn, model_dir, side_args))
    best = {side: _best(results) for side, results in rounds.items()}
    tokens = args.batch * (args.prompt + args.completion)
    x = make_inputs(args.batch, args.prompt, args.completion, group=args.group, lengths=args.lengths)
    real = int(x["prompt_mask"].sum() + x["completion_mask"].sum())  # the batch's real (unpadded) tokens
    for r in best.values():
        r["tokens_per_s"] = tokens / r["step_s"]  # 0 for a side that failed
        r["real_tokens_per_s"] = real / r["step_s"]
    tr = best.get("trl")
    vs_trl = lambda r: r["tokens_per_s"] / tr["tokens_per_s"] if tr and tr["tokens_per_s"] else None
    report = dict(shape=args.shape, batch=args.batch, group=args.group, prompt=args.prompt,
                  completion=args.completion,
                  seq_len=args.prompt + args.completion, tokens_per_update=tokens, real_tokens=real,
                  lengths=args.lengths, rounds=args.rounds, steps=args.steps,
                  **{KEYS.get(side, side): r for side, r in best.items()})
    if tr:
        report.update({_speedup_key(side): vs_trl(r)
                       for side, r in best.items() if side != "trl"})
    if best.get("trl-ckpt", {}).get("tokens_per_s"):  # against TRL with its default activation checkpointing
        ckpt = best["trl-ckpt"]["tokens_per_s"]
        report.update({_speedup_key(side) + "_vs_trl_ckpt": r["tokens_per_s"] / ckpt
                       for side, r in best.items() if not side.startswith("trl")})
    return report


def _speedup_key(side: str) -> str:
    """The report's key of a side's tokens/s over TRL's."""
    return "speedup" + ("" if side == "jaxrl" else "_" + side)


def main(argv=None) -> int:
    args = parse(argv)
    report = measure(args)
    best = {side: report[KEYS.get(side, side)] for side in args.sides.split(",")}
    vs_trl = lambda side: report.get(_speedup_key(side))
    real, tokens = report["real_tokens"], report["tokens_per_update"]
    print(json.dumps(report, indent=2))
    print(f"GRPO update, {args.shape} shape, B={args.batch} G={args.group} prompt={args.prompt} "
          f"completion={args.completion} ({args.lengths}, {real} of {tokens} tokens real), "
          f"best of {args.rounds} round(s):")
    for side, r in best.items():
        name = NAMES[side].format(rank=args.lora_rank)
        if "error" in r:
            print(f"  {name:34s} failed ({r['error']})")
            continue
        ratio = f"  -> {vs_trl(side):.2f}x TRL" if vs_trl(side) is not None else ""
        kind = "unpadded" if r.get("train/unpadded") else "packed"
        how = f", {kind}: {r['train/packed_rows']:.2f} of the positions" if r.get("train/packed") else ""
        print(f"  {name:34s} {r['tokens_per_s']:6.0f} tok/s ({r['step_s'] * 1e3:6.1f} ms/update, peak RSS "
              f"{r['peak_rss_mib']:.0f} MiB, loss {r['loss']:.6f}{how}){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
