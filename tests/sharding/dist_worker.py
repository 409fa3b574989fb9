"""One process of the two-process jax.distributed test (run by test_distributed.py, not collected by pytest).

argv: PROCESS_ID NUM_PROCESSES PORT CKPT_DIR. Prints one JSON line with what the test checks.
"""

import json
import sys

from jaxrl.runtime import distributed

pid, n, port, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
distributed.initialize(f"127.0.0.1:{port}", n, pid, timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxrl.sharding import MeshConfig, make_mesh  # noqa: E402

mesh = make_mesh(MeshConfig(data=1, fsdp=-1))
full_NC = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
sharding = NamedSharding(mesh, P("fsdp"))
x_NC = jax.make_array_from_callback(full_NC.shape, sharding, lambda idx: full_NC[idx])

# A cross-process collective: every process contributes its rows, psum over the fsdp axis.
psum = jax.jit(
    jax.shard_map(lambda a: jax.lax.psum(a.sum(), "fsdp"), mesh=mesh, in_specs=P("fsdp"), out_specs=P())
)(x_NC)
local_rows = sorted(int(s.index[0].start) for s in x_NC.addressable_shards)

ckptr = ocp.StandardCheckpointer()
ckptr.save(f"{ckpt_dir}/state", {"x": x_NC, "step": np.int32(7)})
ckptr.wait_until_finished()
target = {"x": jax.ShapeDtypeStruct(full_NC.shape, np.float32, sharding=sharding),
          "step": jax.ShapeDtypeStruct((), np.int32)}
restored = ckptr.restore(f"{ckpt_dir}/state", target)
restored_ok = all(
    np.array_equal(np.asarray(s.data), full_NC[s.index]) for s in restored["x"].addressable_shards
) and int(restored["step"]) == 7

print(json.dumps({
    "pid": pid, "process_index": jax.process_index(), "process_count": jax.process_count(),
    "global_devices": jax.device_count(), "psum": float(np.asarray(psum.addressable_data(0))),
    "local_rows": local_rows, "restored_ok": bool(restored_ok), "primary": distributed.is_primary(),
}), flush=True)
ckptr.close()  # no orbax thread left running into interpreter shutdown
jax.distributed.shutdown()
