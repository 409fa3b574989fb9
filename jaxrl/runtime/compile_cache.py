"""JAX's persistent compilation cache, kept away from the XLA:CPU programs it breaks.

jaxlib 0.10.2's XLA:CPU loses the order of a program's collectives when it deserializes the executable (every
hit of the persistent cache, `JAX_COMPILATION_CACHE_DIR`): each nested thunk sequence (the body of a `while`
or a `conditional`) gets a collective-communicator resource of its own instead of the program's one, so a loop
holding collectives (FSDP all-gathers in the layer scan) and a collective outside it (the loss normaliser's
all-reduce) no longer wait for each other; the fresh compile orders them. Devices may then enter the two in
different orders, and with as many XLA:CPU pool threads as devices (8 fake devices on a small host) every
thread ends up blocked in one of the two rendezvous: XLA aborts after its collective timeout (`Fatal Python
error: Aborted`, `AwaitAndLogIfStuck` <- `InProcessCommunicator::AllGather` <- `WhileThunk`). Seen in the RL
update loaded from the cache (`tests/rewards/test_reward_type_configs.py -k proxy_grm`, run twice on one
cache) and in the packed SFT warm start. `TF_CPP_VMODULE=thunk_executor=6` shows it: the update's layer
`while` depends on the all-reduce when compiled, not when loaded. Reproduction and regression test:
`tests/runtime/test_compile_cache.py`.

`install()` keeps such programs out of the cache (neither read nor written; compiled like on a cold cache, the
same binary): on the CPU backend, partitioned over more than one device, with a `while` or `case` anywhere
(their collectives are placed later by the partitioner, so any loop of a sharded program counts). Every other
program, the one-device CLI runs' included, still uses the cache.
"""

from __future__ import annotations

import numpy as np

_CONTROL_FLOW = frozenset({"stablehlo.while", "stablehlo.case", "stablehlo.if"})


def _has_control_flow(module) -> bool:
    """Whether the (StableHLO) `module` has a loop or a conditional."""
    from jax._src.lib.mlir import ir

    found = []

    def visit(op):
        if op.name in _CONTROL_FLOW:
            found.append(op.name)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return bool(found)


def uncacheable(backend, computation, devices) -> bool:
    """Whether a program must not go through the persistent cache (module docstring)."""
    return (getattr(backend, "platform", None) == "cpu" and np.size(devices) > 1
            and _has_control_flow(computation))


def install() -> None:
    """Wraps JAX's cache-key function (not public API: `jax._src.compiler._get_cache_key`; jaxrl pins jax
    0.10.2, and `tests/runtime/test_compile_cache.py` fails if the wrap stops working) so that it returns no key
    for `uncacheable` programs, which JAX then compiles without the cache. Idempotent."""
    from jax._src import compilation_cache, compiler

    get_key = getattr(compiler, "_get_cache_key", None)
    if get_key is None or getattr(get_key, "_jaxrl_cpu_collectives", False):
        return

    def _get_cache_key(options, backend, computation, devices, *args, **kwargs):
        if compilation_cache.is_cache_used(backend) and uncacheable(backend, computation, devices):
            return None
        return get_key(options, backend, computation, devices, *args, **kwargs)

    _get_cache_key._jaxrl_cpu_collectives = True
    compiler._get_cache_key = _get_cache_key
