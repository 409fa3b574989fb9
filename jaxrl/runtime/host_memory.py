"""Host allocator setting for XLA:CPU runs: reuse freed buffers instead of page-faulting them back in.

XLA:CPU allocates each execution's temporary buffers (hundreds of MB for a training step) with glibc `malloc`
from a worker thread. A request that large does not fit a thread's arena (at most 64 MiB), so glibc serves it
with a fresh `mmap` and unmaps it on `free`: every step then faults its whole working set back in, one minor
fault per 4 KiB page, each page zeroed by the kernel. On the project's 2-core VM this was ~98,000 faults and
20-25% of the time of one GRPO update of the `benchmarks/train_step.py` model (benchmarks/RESULTS.md).

`keep_freed_buffers()` sets, through mallopt(3), before any XLA thread allocates:

    M_ARENA_MAX      = 1        every thread allocates from the main heap, which (unlike a thread arena)
                                grows to any size,
    M_MMAP_MAX       = 0        no request is served by a private mmap,
    M_TRIM_THRESHOLD = 1 GiB    up to 1 GiB of free memory at the top of the heap stays mapped,

so the next step reuses the previous step's pages. The process keeps that memory mapped until exit instead of
returning it between steps, and one heap can fragment: its peak can exceed glibc's default.

Measured (benchmarks/RESULTS.md, "Host allocator modes"), per mode, peak RSS of the whole `jaxrl train`
process and the time of one GRPO update:

* 4-layer benchmark model (`benchmarks/train_step.py`, B=16, L=128, idle CPU, 2026-11-24): `keep` 305 ms
  vs 390 ms per update (98,000 -> 4,500 page faults); peak RSS ~1290 vs 1117 MiB.
* SmolLM2-135M GRPO, two steps of `configs/smollm2_arithmetic.yaml` (32 rows): peak RSS 18.5 GB with `keep`
  vs 10.7 GB with `default` (issue 14's measurement).
* The same with 16 rows (`data.prompts_per_step=2`, shared CPU at load 20-30, 2026-11-24): 6.59 vs 6.52 GiB;
  step times under that load (keep 172 s, default 123 s for the second step) say nothing either way.

A default that can add 70% to the peak (18.5 GB on a 24 GiB host) fails worse than a 20% slower update, so
the buffers are kept only on request. One arena also serialises `malloc` across threads, which could cost on
a many-core host.

Separately, `release_freed()` (malloc_trim(3)) returns the free pages inside the heap to the kernel. Compiling
a program leaves hundreds of MB of freed but still mapped compiler memory scattered through glibc's heaps;
the first steps then allocate their buffers beside it instead of in it, so the process peaks at compile
residue + step. `jaxrl.learner.cpu_compile` releases after each compile: the tiny benchmark update
(`benchmarks/train_step.py`'s model, 16 rows of 64 + 128 tokens, 2026-12-01) then peaked at its compile's
762 MiB instead of 1021 MiB (the process held 477 MiB after the release, before its first step;
benchmarks/RESULTS.md).

`JAXRL_HOST_MALLOC` chooses: `default` (the default: leave glibc alone), `keep` (the settings above), or
`auto` (keep when no accelerator device node is visible). Only glibc on Linux is touched; elsewhere this is a
no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

ENV_VAR = "JAXRL_HOST_MALLOC"
_MODES = ("auto", "keep", "default")
DEFAULT_MODE = "default"  # chosen from the peak-RSS measurements in the module docstring
# mallopt(3) parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_TRIM_BYTES = 1 << 30
_ACCELERATOR_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None
    except OSError:
        return None


def keep_freed_buffers() -> bool:
    """Applies the settings of the module docstring; True if glibc accepted all three."""
    libc = _glibc()
    if libc is None:
        return False
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_BYTES))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


def release_freed() -> bool:
    """malloc_trim(0): returns free heap pages to the kernel (glibc on Linux; elsewhere False, a no-op)."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None and hasattr(libc, "malloc_trim") else False


def accelerator_visible() -> bool:
    """Whether a TPU (/dev/accel*, /dev/vfio/N) or NVIDIA GPU device node exists on this host."""
    return any(glob.glob(pattern) for pattern in _ACCELERATOR_NODES)


def configure_from_env(environ=os.environ) -> bool:
    """Reads `JAXRL_HOST_MALLOC` and applies it; returns whether the buffers are now kept.

    Call before JAX starts its CPU threads (the `jaxrl` CLI does, before importing jax).
    Raises ValueError for a value outside auto / keep / default.
    """
    mode = environ.get(ENV_VAR, DEFAULT_MODE).strip().lower() or DEFAULT_MODE
    if mode not in _MODES:
        raise ValueError(f"{ENV_VAR}={environ[ENV_VAR]!r} is not one of {', '.join(_MODES)}")
    if mode == "default" or (mode == "auto" and accelerator_visible()):
        return False
    return keep_freed_buffers()
