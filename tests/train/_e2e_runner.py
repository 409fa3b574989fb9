"""Runs several tiny trainer configurations in one process (shared imports and compile cache); used by
test_e2e.py in a subprocess.

usage: python _e2e_runner.py OUT.json BASE_DIR CASE [CASE...]   (CASE names come from `CASES`)

For each case it writes {metrics rows, max |Δparam| between the initial model and the last checkpoint, the
XLA compilations seen after the first metrics row, those after the SFT warm start's first step, error}.
Nothing is asserted here.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from _common import BASE, metrics

CASES: dict[str, tuple[str, ...]] = {
    "grpo": ("algorithm.name=grpo",),
    "dr_grpo": ("algorithm.name=dr_grpo", "algorithm.agg_mode=seq-mean-token-sum-norm"),
    # Only the length reward: a group whose 4 completions all hit max_new_tokens is degenerate and resampled.
    "dapo": ("algorithm.name=dapo", "algorithm.clip.high=0.28", "algorithm.params.max_tries=3",
             "rewards=[{name: short, type: function, function: '_train_rewards:short'}]", "train.steps=3"),
    "rloo": ("algorithm.name=rloo", "sft_warmup.steps=3", "sft_warmup.batch_size=4"),  # + a warm start
    "gdpo": ("algorithm.name=gdpo",),
    "gd2po": ("algorithm.name=gd2po",),
    "etr": ("algorithm.name=etr", "algorithm.params.alpha=0.5", "algorithm.params.beta=0.5"),
    "clipo": ("algorithm.name=clipo",),
    "sft_aux": ("algorithm.name=sft_aux", "algorithm.params.lam=0.5"),
    "kl_loss": ("algorithm.name=grpo", "algorithm.kl.beta=0.1", "algorithm.kl.where=loss"),
    "kl_reward": ("algorithm.name=grpo", "algorithm.kl.beta=0.1", "algorithm.kl.where=reward"),
    "ppo": ("algorithm.name=grpo", "algorithm.ppo_epochs=2", "algorithm.mini_batches=2"),
    "grpo3": ("algorithm.name=grpo", "train.steps=3"),
    "cispo": ("algorithm.name=grpo", "algorithm.objective.name=cispo"),
    "gspo_tis": ("algorithm.name=grpo", "algorithm.objective.name=gspo", "algorithm.mismatch.mode=tis",
                 "algorithm.mismatch.level=sequence"),
}


class _CompileLog(logging.Handler):
    """Records 'Finished XLA compilation of <fn>' messages with the number of metrics rows written so far (-1:
    between the SFT warm start's first step and its end, which jaxrl.rl.loop logs as 'SFT warm start:
    step 1/N' and 'SFT warm start: NLL a -> b')."""

    def __init__(self):
        super().__init__()
        self.run_dir: Path | None = None
        self.events: list[tuple[int, str]] = []
        self.warming = self.warm_started = False

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("SFT warm start: step 1/"):
            self.warming = self.warm_started = True
        elif msg.startswith("SFT warm start: NLL"):
            self.warming = False
        if "Finished XLA compilation" in msg and self.run_dir is not None:
            f = self.run_dir / "metrics.jsonl"
            rows = len(f.read_text().splitlines()) if f.exists() else 0
            self.events.append((-1 if self.warming else rows, msg.split(" in ")[0]))


def _max_param_change(cfg, run_dir: Path) -> float:
    from jaxrl.io import build
    from jaxrl.io import model_io

    tok = build.build_tokenizer(cfg.model, cfg.tokenizer)
    init = nnx.state(build.build_model(cfg.model, vocab_size=len(tok), seed=cfg.train.seed), nnx.Param)
    final, _ = model_io.load_model_checkpoint(run_dir)
    a, b = init.to_pure_dict(), nnx.state(final, nnx.Param).to_pure_dict()
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def main(out: str, base_dir: str, names: list[str]) -> None:
    from jaxrl.config import load_config
    from jaxrl.rl.loop import train

    jax.config.update("jax_log_compiles", True)
    handler = _CompileLog()
    logging.getLogger("jax").addHandler(handler)
    logging.getLogger("jax").setLevel(logging.WARNING)
    logging.getLogger("jaxrl.rl").addHandler(handler)
    logging.getLogger("jaxrl.rl").setLevel(logging.INFO)
    results = {}
    for name in names:
        run_dir = Path(base_dir) / name
        handler.run_dir, handler.events, handler.warm_started = run_dir, [], False
        try:
            cfg = load_config(None, [*BASE, *CASES[name]])
            train(cfg, run_dir)
            late = [m for rows, m in handler.events if rows >= 1]
            handler.run_dir = None
            rows = metrics(run_dir, drop_timing=False)
            warm = [m for rows, m in handler.events if rows == -1] if handler.warm_started else None
            results[name] = {"rows": rows, "late_compiles": late, "warm_start_compiles": warm, "error": None,
                             "param_change": _max_param_change(cfg, run_dir)}
        except Exception:  # noqa: BLE001 -- reported to the test, which fails with the traceback
            results[name] = {"error": traceback.format_exc()}
    handler.run_dir = None
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
