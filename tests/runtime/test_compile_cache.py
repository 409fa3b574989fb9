"""A sharded XLA:CPU program with collectives in loops, run twice on one persistent compilation cache, finishes
(`jaxrl.runtime.compile_cache`): loaded from the cache, jaxlib 0.10.2 lost the order of its collectives and
the second run deadlocked, then aborted (`Fatal Python error: Aborted`), as the RL update of
`tests/rewards/test_reward_type_configs.py -k proxy_grm` did on a developer's second `make test`.

The program is the update's shape in small: FSDP all-gathers inside layer scans, and collectives outside them
that neither feed nor read the loops (the update's loss-normaliser all-reduce). XLA's collective timeout is
lowered so that a deadlock aborts in seconds. Without the guard the second run aborted in 1 of 3 tries (2-core
host, 100 calls; 5 of 6 with 200); whatever the race does, the loop program is then written to and read from
the cache, which this test checks as well: it fails every time without the guard.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxrl.learner.train_step  # noqa: F401  (the trainer's module installs the cache guard)

mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
sh = lambda *spec: jax.sharding.NamedSharding(mesh, P(*spec))


def layer(h, w):  # FSDP: this layer's weight is gathered inside the scan
    return jnp.tanh(h @ lax.with_sharding_constraint(w, sh())), None


def step(ws, x, m):
    n = jax.shard_map(lambda m: lax.psum(m, "fsdp"), mesh=mesh, in_specs=P("fsdp"), out_specs=P())(m)
    g = jax.shard_map(lambda m: lax.all_gather(m, "fsdp"), mesh=mesh, in_specs=P("fsdp"), out_specs=P(),
                      check_vma=False)(m)
    hs = [lax.scan(layer, jnp.tanh(x * (i + 1)), w)[0] for i, w in enumerate(ws)]
    return hs, n, g, [jnp.sin(x * k) for k in range(8)]  # unrelated work: the thunks run concurrently


total = jax.jit(lambda m: jnp.sum(m))  # a sharded program without loops: still cached
f = jax.jit(step, in_shardings=(sh(None, "fsdp"), sh("fsdp"), sh("fsdp")))
ws = [jax.device_put(jnp.full((8, 256, 256), 1 / 256), sh(None, "fsdp")) for _ in range(2)]
x = jax.device_put(jnp.ones((256, 256)), sh("fsdp"))
m = jax.device_put(jnp.ones((8, 256)), sh("fsdp"))
for _ in range(100):
    out = jax.block_until_ready(f(ws, x, m))
print("OK", float(out[1][0, 0]), float(total(m)))
"""


def test_sharded_cpu_loop_program_survives_a_warm_cache(tmp_path):
    cache = tmp_path / "cache"
    flags = ("--xla_force_host_platform_device_count=8 --xla_cpu_collective_call_terminate_timeout_seconds=6 "
             "--xla_cpu_collective_call_warn_stuck_timeout_seconds=3")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, PYTHONPATH=str(REPO),
               JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    for run in ("cold", "warm"):
        p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=180)
        assert p.returncode == 0 and "OK 8.0 2048.0" in p.stdout, f"{run}: exit {p.returncode}\n{p.stderr[-3000:]}"
    names = sorted(f.name.rsplit("-", 2)[0] for f in cache.iterdir())
    assert "jit__lambda" in names  # the cache still serves the loop-free sharded program
    assert "jit_step" not in names  # the loop program is neither written nor read
