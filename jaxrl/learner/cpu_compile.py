"""XLA:CPU programs with YNNPACK dot fusions, and a guard against the fusion jaxlib 0.10.2 crashes on.

XLA:CPU can hand each dot, with its elementwise neighbours, to YNNPACK (`xla_cpu_experimental_ynn_fusion_type`);
the update runs 13% faster with the dot fusion (`LIBRARY_FUSION_TYPE_DOT`), the shared-prompt update 1.13-1.54x
(benchmarks/RESULTS.md). jaxlib 0.10.2's YNNPACK writes through a null output pointer in its fp32 dot kernel
(`ynn::dot_fp32_1x32x2_1x8x2_avx512`, a segfault seen with gdb on an AMD EPYC) when a fusion pads a dot's
result and then uses the padded tensor, as in

    fusion(a, b, c) = add(pad(dot(a, b), 0_1024x0_0), c)     # [128, 128] x [128, 32], padded to 1152 rows

(reproduced standalone: `tests/train/test_cpu_compile.py`). The gradient of a concatenation compiles to such
a fusion: the shared-prompt update of an earlier attention layout did (configs/search_tiny.yaml's shapes), so
grouped programs were compiled without YNNPACK. A pad at a fusion's root (the loss's gradient scattered back to
the completion positions, in every unshared update) runs correctly.

`cpu_jit` is `jax.jit` with that guard: on CPU it compiles each new input signature with the fast options,
reads the optimised program, and if any YNNPACK fusion uses a padded tensor it runs that signature's program
compiled without YNNPACK instead (and says so once on stderr). A program without the pattern is the one
`jax.jit` compiles and calls (its in-memory cache holds the ahead-of-time compile: nothing is compiled twice).
Other backends get plain `jax.jit`. After each compile the heap's free pages go back to the kernel
(`host_memory.release_freed`): the step's buffers then reuse the compiler's memory instead of adding to it.
"""

from __future__ import annotations

import re
import sys

import jax

from jaxrl.runtime import host_memory

YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"
YNN_DOT = {YNN_OPTION: "LIBRARY_FUSION_TYPE_DOT"}  # each dot fused with its elementwise neighbours
NO_YNN = {YNN_OPTION: ""}  # no YNNPACK fusion: XLA's own dot emitter

_YNN_FUSION = re.compile(r'calls=%([\w.\-]+)[^\n]*"kind":"__ynn_fusion"')
_COMPUTATION = re.compile(r"^%?([\w.\-]+) \([^\n]*\{\n(.*?)\n\}", re.M | re.S)
_PAD = re.compile(r"^\s*%([\w.\-]+) = [^\n]* pad\(", re.M)


def unsafe_ynn_fusions(hlo_text: str) -> list[str]:
    """Names of the computations of YNNPACK fusions in an optimised XLA:CPU program (`Compiled.as_text()`)
    where a `pad` result is an operand of another instruction of the fusion (the crashing pattern above)."""
    bodies = {m.group(1): m.group(2) for m in _COMPUTATION.finditer(hlo_text)}
    unsafe = []
    for name in dict.fromkeys(_YNN_FUSION.findall(hlo_text)):
        body = bodies.get(name, "")
        pads = _PAD.findall(body)
        if any(re.search(rf"[(,]\s*%{re.escape(pad)}[,)]", body) for pad in pads):
            unsafe.append(name)
    return unsafe


def _signature(args):
    """What makes `jax.jit` compile again: the pytree, each leaf's shape, dtype and placement, static leaves."""
    leaves, tree = jax.tree.flatten(args)
    return tree, tuple((x.shape, x.dtype, getattr(x, "sharding", None), getattr(x, "weak_type", False))
                       if hasattr(x, "shape") else (type(x), x) for x in leaves)


class CpuJit:
    """`jax.jit(fun, compiler_options=fast, ...)` on XLA:CPU, with each signature whose optimised program holds
    an unsafe YNNPACK fusion run from `jax.jit(fun, compiler_options=NO_YNN, ...)` instead."""

    def __init__(self, fun, fast: dict | None, jit_kwargs: dict):
        self._fast = jax.jit(fun, compiler_options=fast, **jit_kwargs)
        self._safe = jax.jit(fun, compiler_options=NO_YNN, **jit_kwargs)
        self._uses_fast: dict = {}
        self._name = getattr(fun, "__name__", None) or getattr(getattr(fun, "func", None), "__name__", "program")

    def uses_ynn(self, *args) -> bool:
        """Whether the program for `args`' signature is the fast one (compiling it the first time)."""
        key = _signature(args)
        if key not in self._uses_fast:
            unsafe = unsafe_ynn_fusions(self._fast.lower(*args).compile().as_text())
            host_memory.release_freed()  # the compiler's freed memory, before the program's buffers
            if unsafe:
                print(f"jaxrl: {self._name}: compiled without YNNPACK on CPU ({len(unsafe)} fusion(s) pad a dot "
                      f"and reuse it, which jaxlib 0.10.2 crashes on: {unsafe[0]})", file=sys.stderr, flush=True)
            self._uses_fast[key] = not unsafe
        return self._uses_fast[key]

    def __call__(self, *args):
        return (self._fast if self.uses_ynn(*args) else self._safe)(*args)

    def lower(self, *args):
        """The lowering of the program a call with `args` runs (`jaxrl plan --compile`)."""
        return (self._fast if self.uses_ynn(*args) else self._safe).lower(*args)

    def _cache_size(self) -> int:
        return self._fast._cache_size() + self._safe._cache_size()


def cpu_jit(fun, *, fast: dict | None = YNN_DOT, backend: str | None = None, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` compiled with the XLA:CPU options `fast` (None: XLA's default YNNPACK
    fusions) under the guard above on CPU; plain `jax.jit` on other backends (`backend`: default JAX's)."""
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu":
        return jax.jit(fun, **jit_kwargs)
    return CpuJit(fun, fast, jit_kwargs)
