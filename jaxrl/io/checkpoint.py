"""Training checkpoints: orbax `CheckpointManager` with async saves, keep-last-K, corrupted-step fallback.

Layout (read by `jaxrl.io.model_io.load_model_checkpoint` and `jaxrl export-hf`):

    RUN/checkpoints/model_config.json     TransformerConfig JSON (written once by the primary process)
    RUN/checkpoints/tokenizer/            optional, `tokenizer.save_pretrained`
    RUN/checkpoints/<step>/params/        pure dict of the model's nnx.Param state (StandardSave)
    RUN/checkpoints/<step>/opt_state/     optax state pytree (StandardSave)
    RUN/checkpoints/<step>/extra/         JSON: step, RNG key data, data-iterator state, metric counters

Atomicity is orbax's: a step is written under a temporary name and renamed when complete, so a process killed
mid-save (SIGKILL) leaves no `<step>` directory. A step that exists but cannot be restored (truncated files)
is moved aside to `corrupt-<step>-<time>` with a warning once an older step restores, and that step is used.
(`jaxrl.runtime.preemption.PreemptionGuard` turns SIGTERM and SIGINT into a flag that the training loop checks
between steps to save once more and stop.) A step that fails to restore, and a full disk, are reported in one
line each (orbax's leftover tracebacks are silenced: `jaxrl.io.orbax_noise`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jaxrl.errors import CheckpointError
from jaxrl.io.orbax_noise import disk_full, drain_background_writers, quiet_disk_full_noise, quiet_restore_noise

log = logging.getLogger(__name__)

# "behind": an async run's sampler versions (`jaxrl.rl.ahead`), saved only by such runs; "critic": PPO's value
# model and its optimiser state (`jaxrl.rl.critic`, an update schedule's `arrays`), saved only by such runs
ITEMS = ("params", "opt_state", "extra", "behind", "critic")
MODEL_CONFIG = "model_config.json"
WARM_START_STEP = 0  # the step directory of the warm-started state (before RL step 1)


class Restored(NamedTuple):
    step: int
    params: Any
    opt_state: Any
    extra: dict[str, Any]


def key_to_json(key: jax.Array) -> dict[str, Any]:
    """A typed PRNG key as JSON: {"impl": name, "data": nested ints}."""
    return {"impl": str(jax.random.key_impl(key)), "data": np.asarray(jax.random.key_data(key)).tolist()}


def key_from_json(data: dict[str, Any]) -> jax.Array:
    """Inverse of `key_to_json` (bit-exact)."""
    return jax.random.wrap_key_data(np.asarray(data["data"], np.uint32), impl=data["impl"])


def _abstract(tree: Any) -> Any:
    """Restore target: shapes, dtypes and shardings of `tree` (arrays or ShapeDtypeStructs)."""

    def leaf(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

    return jax.tree.map(leaf, tree)


class Checkpointer:
    """Saves and restores (params, opt_state, extra) every `every` steps, keeping the last `keep` (and step 0,
    the state RL starts from after an SFT warm start, when one was saved: `WARM_START_STEP`).

    All processes must call `save` / `restore_latest` (orbax coordinates multi-host writes); only the primary
    process writes `model_config.json`.
    """

    def __init__(self, directory: str | os.PathLike, *, every: int, keep: int, async_save: bool = True):
        # epath: local paths and object stores (gs://...) alike, so a preempted TPU VM resumes from GCS.
        text = os.fspath(directory)
        self.directory = epath.Path(text if "://" in text else os.path.abspath(text))
        self.every = every
        # the newest `keep` steps, and step 0 for good (the warm-started model: the reference of a resumed
        # run with KL, and a model another run can start from, `model.checkpoint=RUN/checkpoints/0`)
        keep_steps = ocp.checkpoint_managers.AnyPreservationPolicy(
            [ocp.checkpoint_managers.LatestN(keep), ocp.checkpoint_managers.CustomSteps([WARM_START_STEP])])
        options = ocp.CheckpointManagerOptions(
            preservation_policy=keep_steps, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._pending: int | None = None  # the step an asynchronous save may still be writing
        quiet_disk_full_noise()

    def restore_params(self, step: int, params_like: Any) -> Any:
        """Only the parameters of `step` (e.g. the warm start's, step 0, for a resumed run's reference)."""
        self.manager.wait_until_finished()
        args = ocp.args.Composite(params=ocp.args.StandardRestore(_abstract(params_like)))
        return self.manager.restore(step, args=args)["params"]

    def should_save(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def restore_behind(self, step: int, params_like: Any, names: list[str]) -> dict[str, Any]:
        """An async run's sampler versions saved with `step` (`names` of the `behind` item), each restored
        like `params_like`."""
        return self.restore_items(step, {"behind": {name: params_like for name in names}})["behind"]

    def restore_items(self, step: int, like: dict[str, Any]) -> dict[str, Any]:
        """The named array items (of `ITEMS`: "behind", "critic") saved with `step`, each restored like
        `like[name]` ({} for none); a step saved without one is a CheckpointError naming it."""
        if not like:
            return {}
        self.manager.wait_until_finished()
        args = ocp.args.Composite(**{name: ocp.args.StandardRestore(_abstract(tree)) for name, tree in like.items()})
        try:
            out = self.manager.restore(step, args=args)
        except (FileNotFoundError, KeyError, ValueError) as e:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} has no {' / '.join(like)} item this "
                                  f"run needs (was it written by a run without it?): {str(e).splitlines()[0][:200]}"
                                  ) from None
        return {name: out[name] for name in like}

    def save(self, step: int, params: Any, opt_state: Any, extra: dict[str, Any],
             behind: dict[str, Any] | None = None, items: dict[str, Any] | None = None) -> None:
        """Starts saving `step` (returns once the arrays are copied; call `wait` to block until written);
        `behind`: an async run's sampler versions (`restore_behind`); `items`: an update schedule's own arrays
        by item name (`restore_items`)."""
        with self._disk_full_is_one_line(self._pending):  # a failed asynchronous save surfaces here
            self.manager.wait_until_finished()
            if step in self.manager.all_steps():
                log.info("checkpoint step %d already exists in %s; not saving it again", step, self.directory)
                return
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            extra=ocp.args.JsonSave({**extra, "step": step}),
            **({"behind": ocp.args.StandardSave(behind)} if behind else {}),
            **{name: ocp.args.StandardSave(tree) for name, tree in (items or {}).items()},
        )
        with self._disk_full_is_one_line(step):
            self.manager.save(step, args=args, force=True)
        self._pending = step

    @contextlib.contextmanager
    def _disk_full_is_one_line(self, step: int | None):
        """A full disk (or quota) while writing `step`: one CheckpointError line saying what is intact."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 -- re-raised unless it is a full disk
            if not disk_full(e):
                raise
            drain_background_writers()
            kept = [n for n in self.manager.all_steps() if n != step]
            intact = f"step {max(kept)} is the newest intact checkpoint" if kept else "no earlier checkpoint"
            raise CheckpointError(
                f"no space left on the device of {self.directory} while writing checkpoint step {step}; "
                f"{intact}: free space (or point --run-dir elsewhere) and run the same command to resume"
            ) from None

    def write_model_config(self, model_config: dict[str, Any], tokenizer: Any = None) -> None:
        """Writes `model_config.json` (and the tokenizer) next to the steps; primary process only."""
        if jax.process_index() != 0:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{MODEL_CONFIG}.tmp"
        tmp.write_text(json.dumps(model_config, indent=2) + "\n")
        tmp.replace(self.directory / MODEL_CONFIG)
        if tokenizer is not None:
            with tempfile.TemporaryDirectory() as local:
                tokenizer.save_pretrained(local)
                target = self.directory / "tokenizer"
                target.mkdir(parents=True, exist_ok=True)
                for f in Path(local).iterdir():
                    (target / f.name).write_bytes(f.read_bytes())

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def _quarantine(self, steps: list[int]) -> None:
        """Moves unrestorable step directories aside (`corrupt-<step>-<time>`) so they can be rewritten."""
        if jax.process_index() == 0:
            for step in steps:
                src = self.directory / str(step)
                if src.exists():
                    src.rename(self.directory / f"corrupt-{step}-{int(time.time())}")
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("jaxrl_checkpoint_quarantine")  # renames seen by all hosts
        self.manager.reload()

    def _restore(self, step: int, params_like: Any, opt_state_like: Any) -> Restored:
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(_abstract(params_like)),
            opt_state=ocp.args.StandardRestore(_abstract(opt_state_like)),
            extra=ocp.args.JsonRestore(),
        )
        out = self.manager.restore(step, args=args)
        extra = dict(out["extra"])
        if extra.get("step") != step:
            raise CheckpointError(f"extra/step={extra.get('step')} does not match the directory name")
        return Restored(step, out["params"], out["opt_state"], extra)

    def restore_latest(self, params_like: Any, opt_state_like: Any) -> Restored | None:
        """The newest restorable step, or None when the directory holds no step.

        Newer steps that fail while an older one restores into the same targets are corrupt (truncated or
        partial files): they are moved aside with a warning. If no step restores, nothing is moved and a
        `CheckpointError` lists the failures (typically a changed model or optimizer config).

        Args:
          params_like, opt_state_like: pytrees of arrays or ShapeDtypeStructs giving structure, dtype and
            sharding of the restored values.
        """
        self.manager.wait_until_finished()
        quiet_restore_noise()  # a failing restore's leftovers can come from orbax's threads before it raises
        failed: list[tuple[int, Exception]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self._restore(step, params_like, opt_state_like)
            except Exception as e:  # noqa: BLE001 -- decided below, once an older step has been tried
                failed.append((step, e))
                continue
            for bad, e in failed:
                first_line = (str(e).splitlines() or [""])[0][:300]
                log.warning(
                    "checkpoint step %d in %s cannot be restored (%s: %s); using step %d instead",
                    bad,
                    self.directory,
                    type(e).__name__,
                    first_line,
                    step,
                )
            if failed:
                self._quarantine([bad for bad, _ in failed])
            return restored
        if failed:
            detail = "; ".join(
                f"step {n}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}" for n, e in failed
            )
            raise CheckpointError(
                f"no checkpoint in {self.directory} can be restored into this run's model and optimizer "
                f"({detail}); a changed model/optimizer config cannot resume: use a new --run-dir, or "
                "--overwrite-run to move this run aside"
            )
        return None

    def wait(self) -> None:
        with self._disk_full_is_one_line(self._pending):
            self.manager.wait_until_finished()

    def close(self) -> None:
        with self._disk_full_is_one_line(self._pending):
            self.manager.wait_until_finished()
        self.manager.close()
