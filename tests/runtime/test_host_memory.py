"""jaxrl.runtime.host_memory: with the buffers kept, repeated XLA:CPU executions stop page-faulting their
temporaries."""

import json
import os
import subprocess
import sys

import pytest

from jaxrl import cli
from jaxrl.runtime import host_memory

# tests/suite.py runs these alone: page-fault counts depend on what else runs on the machine.
pytestmark = pytest.mark.serial

# Two 64 MiB temporaries per call (sin(x) and cos(x)ᵀ feed dots), freed at the end of each execution.
_PROBE = r"""
import json, resource, statistics
from jaxrl.runtime import host_memory
kept = host_memory.configure_from_env()
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), jnp.float32)
f = jax.jit(lambda x: jnp.sum(jnp.sin(x) @ x[:, :64]) + jnp.sum(jnp.cos(x).T @ (jnp.sin(x) @ x[:, :64])))
faults = []
for _ in range(32):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(f(x))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
# The median call after the first eight: the kept heap still grows now and then while it settles (a call that
# extends it faults in the new pages; on a loaded machine the thread pool overlaps temporaries differently
# from call to call, so it settles later: CI once saw half a call's pages at the median of calls 5-16), but
# a typical call reuses it.
print(json.dumps({"kept": kept, "faults": statistics.median(faults[8:])}))
"""


def _probe(mode: str) -> dict:
    env = dict(os.environ, JAXRL_HOST_MALLOC=mode, XLA_FLAGS="")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc malloc only")
def test_kept_buffers_cut_page_faults_of_repeated_executions():
    default, kept = _probe("default"), _probe("keep")
    pages_per_call = 2 * 64 * 2**20 // 4096
    assert not default["kept"] and kept["kept"]
    assert default["faults"] > 0.5 * pages_per_call  # glibc re-mmaps the temporaries on every call
    assert kept["faults"] < 0.1 * default["faults"]


def test_auto_leaves_malloc_alone_on_an_accelerator_host(monkeypatch):
    monkeypatch.setattr(host_memory, "accelerator_visible", lambda: True)
    monkeypatch.setattr(host_memory, "keep_freed_buffers", lambda: pytest.fail("mallopt called"))
    assert host_memory.configure_from_env({}) is False
    assert host_memory.configure_from_env({"JAXRL_HOST_MALLOC": "default"}) is False


def test_bad_mode_is_a_clear_cli_error(monkeypatch, capsys):
    monkeypatch.setenv("JAXRL_HOST_MALLOC", "sometimes")
    assert cli.main(["plot", "--help"]) == 2
    err = capsys.readouterr().err
    assert "JAXRL_HOST_MALLOC='sometimes' is not one of auto, keep, default" in err


_RELEASE_PROBE = r"""
import json
from jaxrl.runtime import host_memory

def rss_mib():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024

chunks = [bytearray(4000) for _ in range(50_000)]  # ~200 MB of small (malloc, not mmap) allocations
pin = bytearray(4000)  # above them: free() alone cannot trim the heap's top
del chunks
before = rss_mib()
released = host_memory.release_freed()
print(json.dumps({"released": released, "before": before, "after": rss_mib()}))
"""


def test_release_freed_returns_the_heaps_free_pages():
    """Freed small allocations below a live one stay mapped (glibc trims only the heap's top) until
    `release_freed` (what `cpu_compile` calls after each compile) hands them back."""
    out = subprocess.run([sys.executable, "-c", _RELEASE_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["released"] is True
    assert got["before"] - got["after"] > 100, got  # MiB
