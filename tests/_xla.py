"""XLA_FLAGS of every process the test suite starts: pytest and its workers, and the CLIs the tests launch.

`FAST_COMPILE` (`--xla_backend_optimization_level=1`) compiles XLA:CPU's generated code with LLVM's -O1
instead of -O2. Most of the suite's time on tiny models is compiling, not running. Measured on the 2-core machine
(2026-11-27, the quickstart model, first RL step, which is mostly compile, no compile cache): -O2 18.8 s, -O1
13.4 s, -O0 12.1 s. The later steps: 0.71-0.89 s at -O2, 0.69-0.72 s at -O1 and 1.37-1.48 s at -O0, so -O0
is not used. Results differ from -O2's in the last bits (entropy 4.427338 against 4.4273386), as they do on
another CPU. A comparison inside a test runs both of its sides with the same flags. The "learns" runs
(`train_cli`, the quickstart test) keep XLA's defaults: their trajectories are the documented ones.
It also turns XLA:CPU's MLIR fusion emitters off (`--xla_cpu_use_fusion_emitters=false`: each fusion's kernel
from the older elemental emitter): a cold-cache tiny CLI train (2 RL steps, 5 SFT steps) took 35.5 and 32.8
CPU-s with the emitters, 31.9 and 29.3 without (2026-11-29, about 10% less); the compile-hygiene worker's
evpv_tiny programs 27.0 -> 14.1 CPU-s.
`JAXRL_TEST_XLA_DEFAULTS=1` runs the whole suite with XLA's defaults (to compare, or to rule the flags out).

`COMPILE_ONLY` (-O0) is for a process that is all compiling (the compile-hygiene worker runs each program
once on tiny inputs and reads the compiler's warnings, which come from XLA's HLO passes, before LLVM): one
reduced config's three programs on 8 devices took 24.4 s (33.7 s CPU) at -O1 and 21.0 s (26.4 s CPU) at -O0
(2026-11-29), with the same warnings. Elsewhere -O0 does not pay: tests/models ran 28% faster (254 -> 182 s
on two workers; one float32 comparison at rtol 1e-6 came out at 1.0006e-6), but tests/experiments, which run
150-step warm starts in process, took 595 test-seconds against 460, and the flag holds for a whole process.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULTS = os.environ.get("JAXRL_TEST_XLA_DEFAULTS") == "1"
FAST_COMPILE = "" if DEFAULTS else "--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false"
COMPILE_ONLY = "" if DEFAULTS else "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int | None = None, *, compile_only: bool = False) -> str:
    """`XLA_FLAGS` for a suite process: `devices` fake CPU devices (None: XLA's one device) and FAST_COMPILE
    (`compile_only`: COMPILE_ONLY, for a process that is all compiling)."""
    count = "" if devices is None else f"--xla_force_host_platform_device_count={devices}"
    return f"{count} {COMPILE_ONLY if compile_only else FAST_COMPILE}".strip()


def suite_cache_dir() -> Path:
    """The suite's one persistent compilation cache (`JAX_COMPILATION_CACHE_DIR`, set by `make test`; else the
    clone's `.cache/jax`), for CLI subprocesses that set their own environment."""
    return Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or Path(__file__).resolve().parents[1] / ".cache" / "jax")
