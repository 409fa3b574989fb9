"""jaxrl's update against TRL's over a grid of shapes (issue 33 item 7), one table.

    .venv/bin/python benchmarks/update_grid.py --shape tiny --out .cache/update_grid_tiny.jsonl
    .venv/bin/python benchmarks/update_grid.py --shape smollm2 --prompts 64,256 --completions 128,512

Every point (prompt x completion x G) is one `benchmarks/train_step.py` measurement (`train_step.measure`: each
side in its own process, round-robin over `--rounds`, median of `--steps` updates after a compiling one, peak
RSS). jaxrl's side is the update the trainer runs at that point with `train.packing: auto`: the batch packed
or unpadded when the packer would do so (`jaxrl.rl.packing.rl_plan`, decided here on the same rows), else each prompt
once per group for G > 1 (`train.share_prompts: auto`), else the padded rows; the table names the path. The
packer is only run where it packs, so a point costs two sides (jaxrl, TRL), or three when it packs (the
unpacked update too, for the record). `--trl trl,trl-ckpt` measures TRL both without activation checkpointing
and with it (GRPOConfig's default, which `GRPOTrainer.train` turns on); a point is "yes" when jaxrl's update is
>= 1.2x every TRL side's tokens/s at <= its peak RSS (a TRL side that ran out of memory counts as beaten).
Where jaxrl's default update runs out of memory, `model.remat: full` is measured alone afterwards; with
`--remat-on-memory P[,P2]` (policies of mlp, attention, dots, full) those policies also, in order, where the
update runs but holds more peak RSS than a TRL side (TRL's default recomputes each layer too), until one does
not. A remat side runs the update `train.packing: auto` runs at the point (packed or unpadded where the packer
packs, as a config setting both would), and the table names its path and policy; the point is judged on the
default update, else on the first remat side (mlp, attention, dots, full) that meets the target. `--remat-only`
measures the remat policies without the default update (at points where that is known to exceed TRL's
memory), and `--no-unpacked` skips the unpacked update at points the packer packs. Results are appended to
`--out` (JSON lines) as each point finishes, and points already there are skipped (a long grid can be
resumed), except that `--remat-on-memory` measures its policies at a stored point that still needs them (the
point's line is appended again with them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import train_step  # noqa: E402  (benchmarks/train_step.py)


def packs(batch: int, prompt: int, completion: int, group: int, lengths: str, shape: str = "tiny") -> bool:
    """Whether `train.packing: auto` packs or unpads this point's batch on one device (`RLPacker`'s decision,
    with the `shape` model's attention weight)."""
    from jaxrl.rl import packing

    x = train_step.make_inputs(batch, prompt, completion, group=group, lengths=lengths)
    mask = np.concatenate([x["prompt_mask"], x["completion_mask"]], 1)
    weight = train_step.attention_weight(shape)
    return packing.rl_plan(mask, prompt, group, blocks=1, attention_weight=weight) is not None


def _path(side: dict, report: dict) -> str:
    """Which update a jaxrl side ran: unpadded or packed rows (the packer packed), else each prompt once per
    group (G > 1), else the padded rows; with its `model.remat` policy where one was set."""
    if side.get("train/packed"):
        path = "unpadded" if side.get("train/unpadded") else "packed"
    else:
        path = "shared prompt" if report["group"] > 1 else "padded"
    return path + (f", remat {side['remat']}" if side.get("remat") else "")


def _remats(report: dict) -> list[dict]:
    """The point's `model.remat` sides that were measured (in `train_step.REMAT_POLICIES`' order), each on the
    update `train.packing: auto` runs there (`jaxrl_packed_remat_P`) or on the padded one (`jaxrl_remat_P`)."""
    found = []
    for policy in train_step.REMAT_POLICIES:
        for key in (train_step.KEYS[f"packed-remat-{policy}"], train_step.KEYS[f"remat-{policy}"]):
            if key in report:
                found.append(dict(report[key], remat=policy))
    return found


def _jaxrl_side(report: dict) -> tuple[str, dict]:
    """(path, result) of the jaxrl update at a point: of the default update (packed or unpadded where the packer
    packs) and the `model.remat` sides measured (`_remats`), in that order, the first that ran and meets the
    target (`_verdict`), else the first that ran, else the failed one."""
    default = report.get("jaxrl_packed", report.get("jaxrl"))
    sides = ([default] if default is not None else []) + _remats(report)
    ran = [r for r in sides if "error" not in r]
    side = next((r for r in ran if _verdict(r, report)[1]), ran[0] if ran else sides[0])
    return _path(side, report), side


def _against(side: dict, trl: dict) -> tuple[str, bool]:
    """(two table cells, whether jaxrl is >= 1.2x at <= peak RSS) against one TRL side; a TRL side that failed
    (out of memory) is beaten by a jaxrl side that ran."""
    if "error" in trl:
        return f"| {trl['error']} | ", "error" not in side
    ratio = side["tokens_per_s"] / trl["tokens_per_s"]
    rss = side["peak_rss_mib"] / trl["peak_rss_mib"]
    return (f"| {trl['tokens_per_s']:.0f} ({trl['peak_rss_mib']:.0f} MiB) | {ratio:.2f}x ({rss:.2f}) ",
            ratio >= 1.2 and rss <= 1.0)


def _verdict(side: dict, report: dict) -> tuple[dict[str, str], bool]:
    """(the table cells of each TRL side measured, by report key; whether `side` is >= 1.2x at <= peak RSS
    against every one of them)."""
    judged = {key: _against(side, report[key]) for key in ("trl", "trl_ckpt") if key in report}
    return {key: c for key, (c, _) in judged.items()}, bool(judged) and all(ok for _, ok in judged.values())


def needs_remat(report: dict) -> bool:
    """Whether jaxrl's update at this point was not measured, failed (out of memory), or ran but held more peak
    RSS than a TRL side that ran."""
    if "jaxrl" not in report and "jaxrl_packed" not in report and not _remats(report):
        return True
    _, side = _jaxrl_side(report)
    return "error" in side or any(
        "error" not in report[k] and side["peak_rss_mib"] > report[k]["peak_rss_mib"]
        for k in ("trl", "trl_ckpt") if k in report)


def row(report: dict, columns: tuple[str, ...] | None = None) -> str:
    """One Markdown table row of a point's report: jaxrl (`_jaxrl_side`) against TRL without and (where
    measured) with its default activation checkpointing; tokens/s (peak RSS), jaxrl / TRL tokens/s (peak RSS).
    `columns` (report keys, e.g. ("trl", "trl_ckpt")): the table's TRL columns, a side the point lacks written
    "not run", so that points measured against different sides share one table; by default the point's own."""
    path, side = _jaxrl_side(report)
    measured, ok = _verdict(side, report)
    cells = [measured.get(k, "| not run | ") for k in (measured if columns is None else columns)]
    mine = "failed" if "error" in side else f"{side['tokens_per_s']:.0f} ({side['peak_rss_mib']:.0f} MiB)"
    return (f"| {report['prompt']} | {report['completion']} | {report['group']} | {path} | {mine} "
            + "".join(cells) + f"| {'yes' if ok else '**no**'} |")


def _point(args, p: int, c: int, g: int, sides: str) -> argparse.Namespace:
    """`benchmarks/train_step.py`'s arguments for one point of the grid and the comma-separated `sides`."""
    return train_step.parse(["--shape", args.shape, "--batch", str(args.batch), "--prompt", str(p),
                             "--completion", str(c), "--group", str(g), "--lengths", args.lengths,
                             "--steps", str(args.steps), "--rounds", str(args.rounds), "--sides", sides])


def _measure(args, report: dict, p: int, c: int, g: int, side: str) -> None:
    """Adds jaxrl side `side` (a remat policy), measured alone at the point, to the point's `report`."""
    report.update({k: v for k, v in train_step.measure(_point(args, p, c, g, side)).items()
                   if k.startswith("jaxrl_")})


def _add_remats(args, report: dict, p: int, c: int, g: int, policies: list[str], packed: bool) -> bool:
    """Measures the `model.remat` policies in order, on the update `train.packing: auto` runs at the point
    (`packed`) or the padded one, while jaxrl's update there is missing, failed or misses on memory
    (`needs_remat`); whether any was measured."""
    measured = False
    for policy in policies:
        side = ("packed-" if packed else "") + f"remat-{policy}"
        if train_step.KEYS[side] in report or not needs_remat(report):
            continue
        _measure(args, report, p, c, g, side)
        measured = True
    return measured


def _record(out: str, report: dict) -> None:
    """Appends the point's report to `out` (the last line of a point is the one read back) and prints its row."""
    with open(out, "a") as f:
        f.write(json.dumps(report) + "\n")
    print(row(report), flush=True)


def _counts(done: dict, key: str) -> str:
    """The `rounds` or `steps` the table's points were measured with (stored points may predate this run)."""
    return " / ".join(str(v) for v in sorted({r[key] for r in done.values()}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(train_step.SHAPES), default="tiny")
    ap.add_argument("--prompts", default="64,256,512")
    ap.add_argument("--completions", default="128,512,1024")
    ap.add_argument("--groups", default="1,8")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lengths", choices=("uniform", "long-tailed"), default="uniform")
    ap.add_argument("--trl", default="trl", help="TRL sides: trl (no activation checkpointing), trl-ckpt "
                    "(its default, as GRPOTrainer.train enables it), or both, comma-separated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--remat-on-memory", nargs="?", const="full", default=None,
                    help="model.remat policies (mlp, attention, dots, full; comma-separated, in order) also measured where "
                    "jaxrl's update holds more peak RSS than a TRL side, until one does not")
    ap.add_argument("--remat-only", action="store_true",
                    help="measure jaxrl only with the --remat-on-memory policies, not the default update (where "
                    "that is known to exceed TRL's memory)")
    ap.add_argument("--no-unpacked", action="store_true",
                    help="where the packer packs, skip the unpacked update measured for the record")
    ap.add_argument("--out", default=None, help="JSON lines, appended per point; points already there are skipped")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(".cache", f"update_grid_{args.shape}_{args.lengths}"
                                            f"{'' if args.trl == 'trl' else '_' + args.trl}.jsonl")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    done = {}
    if os.path.exists(out):
        for line in open(out):
            r = json.loads(line)
            done[r["prompt"], r["completion"], r["group"]] = r
    ints = lambda s: [int(v) for v in s.split(",")]
    policies = args.remat_on_memory.split(",") if args.remat_on_memory else []
    if any(policy not in train_step.REMAT_POLICIES for policy in policies) or (args.remat_only and not policies):
        ap.error(f"--remat-on-memory {args.remat_on_memory}: policies among {', '.join(train_step.REMAT_POLICIES)} "
                 "(needed by --remat-only)")
    for p, c, g in itertools.product(ints(args.prompts), ints(args.completions), ints(args.groups)):
        packed = packs(args.batch, p, c, g, args.lengths, args.shape)
        if (p, c, g) in done:
            report = done[p, c, g]
            if _add_remats(args, report, p, c, g, policies, packed):
                _record(out, report)
            continue
        default = "" if args.remat_only else (
            ("packed," if args.no_unpacked else "jaxrl,packed,") if packed else "jaxrl,")
        report = train_step.measure(_point(args, p, c, g, default + args.trl))
        _add_remats(args, report, p, c, g, policies or (["full"] if "error" in _jaxrl_side(report)[1] else []),
                    packed)
        _record(out, report)
        done[p, c, g] = report
    print(f"\nGRPO update, {args.shape} shape, B = {args.batch}, {args.lengths} completion lengths, "
          f"best of {_counts(done, 'rounds')} round(s), median of {_counts(done, 'steps')} updates:\n")
    trls = [{"trl": "TRL", "trl-ckpt": "TRL, activation checkpointing"}[t] for t in args.trl.split(",")]
    print("| prompt | completion | G | jaxrl path | jaxrl tok/s (peak RSS) | "
          + "".join(f"{t} tok/s (peak RSS) | jaxrl / {t} (RSS ratio) | " for t in trls) + ">= 1.2x at <= RSS |")
    print("|---" * (6 + 2 * len(trls)) + "|")
    columns = tuple(train_step.KEYS.get(t, t) for t in args.trl.split(","))  # report keys
    for key in sorted(done):
        print(row(done[key], columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
