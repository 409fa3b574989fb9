"""A toy training loop with the real checkpoint/data/metrics pieces, used by test_checkpoint.py in
subprocesses.

usage: python _resume_script.py RUN_DIR STEPS [KILL_AT_STEP]
Each step draws a data batch and a PRNG sample and takes one AdamW step; with KILL_AT_STEP the process
SIGKILLs itself right after starting the asynchronous save of that step.
"""

import os
import signal
import sys

import jax
import jax.numpy as jnp
import optax

from jaxrl.io.checkpoint import Checkpointer, key_from_json, key_to_json
from jaxrl.data import Encoder, arithmetic, train_iterator
from jaxrl.runtime.metrics import MetricsWriter
from jaxrl.io.tokenizer import builtin_tokenizer


def main(run_dir: str, steps: int, kill_at: int | None) -> None:
    tx = optax.adamw(0.1)
    params = {"w": jnp.zeros((3,), jnp.float32), "b": jnp.ones((2,), jnp.bfloat16)}
    opt_state = tx.init(params)
    key = jax.random.key(0)
    it = train_iterator(arithmetic(20, 0), Encoder(builtin_tokenizer()), batch_size=2, seed=0)
    ckpt = Checkpointer(f"{run_dir}/checkpoints", every=2, keep=2)
    start = 0
    restored = ckpt.restore_latest(params, opt_state)
    if restored is not None:
        start, params, opt_state = restored.step, restored.params, restored.opt_state
        key = key_from_json(restored.extra["rng"])
        it.set_state(restored.extra["data"])
    writer = MetricsWriter(run_dir, resume_step=start, tensorboard=False)

    def loss_fn(p, x, noise):
        return jnp.sum((p["w"] - x + noise) ** 2) + jnp.sum(p["b"].astype(jnp.float32) ** 2)

    for step in range(start + 1, steps + 1):
        batch = next(it)
        x = jnp.asarray([float(r["answer"]) for r in batch]).mean() / 100
        key, sub = jax.random.split(key)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, jax.random.normal(sub, (3,)))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        writer.write(step, {"loss": loss, "prompt0": batch[0]["prompt"]})
        if ckpt.should_save(step):
            ckpt.save(step, params, opt_state, {"rng": key_to_json(key), "data": it.get_state()})
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    writer.close()
    ckpt.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
