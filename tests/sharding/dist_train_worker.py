"""One process of the two-process training test (run by test_distributed.py, not collected by pytest).

argv: PROCESS_ID NUM_PROCESSES PORT CKPT_DIR. Two FSDP AdamW steps of the tiny model over the devices of both
processes, each process feeding only its own rows; an orbax save + restore of params and optimizer state;
a third step from the restored state. Prints one JSON line with the three losses.
"""

import json
import sys

from jaxrl.runtime import distributed

pid, n, port, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
distributed.initialize(f"127.0.0.1:{port}", n, pid, timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl.models import Transformer, TransformerConfig  # noqa: E402
from jaxrl.sharding import (  # noqa: E402
    FSDP, MeshConfig, abstract_with_shardings, global_batch, make_constrain, make_mesh, state_shardings,
)

CFG = TransformerConfig.tiny()
mesh = make_mesh(MeshConfig(data=1, fsdp=-1))
tx = optax.adamw(1e-2, eps=1e-4)
model = Transformer(CFG, rngs=nnx.Rngs(0), constrain=make_constrain(mesh, FSDP))
graphdef, params = nnx.split(model, nnx.Param)
p_sh = state_shardings(params, mesh, FSDP)
opt_state = tx.init(params)
o_sh = state_shardings(opt_state, mesh, FSDP, params=params)
params, opt_state = jax.device_put(params, p_sh), jax.device_put(opt_state, o_sh)


def step(params, opt_state, tokens_BL):
    def loss_fn(p):
        logits_BLV = nnx.merge(graphdef, p)(tokens_BL[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits_BLV, tokens_BL[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


step = jax.jit(step, out_shardings=(p_sh, o_sh, None), donate_argnums=(0, 1))
# one fixed batch, seen three times: the loss must go down, so equal losses are not equal constants
tokens_BL = np.random.default_rng(0).integers(0, CFG.vocab_size, (8, 10)).astype(np.int32)
rows = 8 // n
losses = []
for i in range(2):
    local_BL = tokens_BL[pid * rows:(pid + 1) * rows]  # this host's rows only
    params, opt_state, loss = step(params, opt_state, global_batch(local_BL, mesh, FSDP))
    losses.append(float(loss))

ckptr = ocp.StandardCheckpointer()
ckptr.save(f"{ckpt_dir}/step2", {"params": params, "opt": opt_state})
ckptr.wait_until_finished()
target = {"params": abstract_with_shardings(jax.eval_shape(lambda: params), p_sh),
          "opt": abstract_with_shardings(jax.eval_shape(lambda: opt_state), o_sh)}
restored = ckptr.restore(f"{ckpt_dir}/step2", target)
_, _, loss = step(restored["params"], restored["opt"], global_batch(local_BL, mesh, FSDP))
losses.append(float(loss))
print(json.dumps({"pid": pid, "losses": losses, "devices": jax.device_count()}), flush=True)
jax.distributed.shutdown()
