"""Collectives of a compiled XLA program, read from its HLO text: how many of each kind, and their bytes.

For `jaxrl plan --compile` (issue 32 item 1): at pod scale a step that all-gathers a whole weight every step,
or that is mostly collectives, must show before the pod is rented. This reads the *compiled* (post-SPMD
partitioning) module text (`jax.jit(f).lower(...).compile().as_text()`), one instruction per line:

    %all-gather.3 = f32[8,128]{1,0} all-gather(f32[1,128]{1,0} %p), channel_id=1, dimensions={0}, ...

Per kind (all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute) it counts the instructions
and sums the bytes of their *results on one device* (the buffer each device ends up holding: the gathered
array for an all-gather, the reduced array for an all-reduce, the scattered shard for a reduce-scatter). That
is a size, not link traffic: a ring all-reduce of B bytes over n devices sends 2·B·(n-1)/n per device, an
all-gather of a B-byte result B·(n-1)/n. Asynchronous pairs (`all-gather-start` / `-done`) count once, at the
start, by their last tuple element (the output). Instructions inside a loop body (a `while` over layers) are
counted once, as written: the caller multiplies by the trip count where it knows it.

`upcast_bytes` reads another CPU-only cost from the same text: XLA:CPU has no bfloat16 dot, so it widens bf16
operands to float32 first, each in a fusion that is a lone `convert` (a bf16 sampler's whole KV cache gets an
f32 copy, twice its bytes, which an accelerator with bf16 dots never makes).
"""

from __future__ import annotations

import re

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

# bytes per element of HLO primitive types
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")
_RESULT = r"(\(.*?\)|[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^}]*\})?)"  # a tuple of types, or one type with layout
_OP = re.compile(r"=\s*" + _RESULT + r"\s+(" + "|".join(KINDS) + r")(-start)?\(")


def array_bytes(text: str) -> list[int]:
    """Bytes of each array type in `text` (e.g. "(f32[8,128]{1,0}, bf16[4])" -> [4096, 8])."""
    out = []
    for dtype, dims in _ARRAY.findall(text):
        if dtype not in _BYTES:
            raise ValueError(f"unknown HLO element type {dtype!r} in {text!r}")
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        out.append(n * _BYTES[dtype])
    return out


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count": instructions, "bytes": summed result bytes per device}} for every kind of `KINDS`
    (zeros for a kind the program does not use)."""
    out = {kind: {"count": 0, "bytes": 0} for kind in KINDS}
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if m is None:
            continue
        result, kind, start = m.groups()
        sizes = array_bytes(result)
        out[kind]["count"] += 1
        out[kind]["bytes"] += sizes[-1] if start else sum(sizes)
    return out


_COMPUTATION = re.compile(r"^%(\S+) \([^:]+: bf16\[[0-9,]*\]\) -> f32\[[0-9,]*\] \{$")
_CALL = re.compile(r"=\s*(f32\[[0-9,]*\])(?:\{[^}]*\})?\s+fusion\(.*calls=%([^,\s]+)")


def upcast_bytes(hlo_text: str) -> int:
    """Summed result bytes (per device) of the fusions that only widen one bf16 array to float32: a computation
    `(p: bf16[...]) -> f32[...]` whose body is the parameter and `ROOT convert(p)`. Each instruction once."""
    lines = hlo_text.splitlines()
    widening = set()
    for i, line in enumerate(lines):
        m = _COMPUTATION.match(line)
        if m and i + 3 < len(lines) and "parameter(0)" in lines[i + 1] and " convert(" in lines[i + 2] \
                and lines[i + 2].lstrip().startswith("ROOT") and lines[i + 3].strip() == "}":
            widening.add(m.group(1))
    total = 0
    for line in lines:
        m = _CALL.search(line)
        if m and m.group(2) in widening:
            total += array_bytes(m.group(1))[0]
    return total
