"""LoRA / QLoRA through `jaxrl train`: only adapters are trained and checkpointed, the base is the KL reference,
and a checkpoint refuses a different base.

* Adapters start with B = 0, so the first step's policy is the base itself: its KL to the reference (the base,
  no second copy) is 0 up to float noise; after an update it is positive.
* The checkpoint's `params` item holds adapter leaves (`lora_a`, `lora_b`) only.
* Resuming on a different base (another init seed of the preset) exits 2 naming the base mismatch.
* QLoRA (int8 base) trains and evaluates (the sampler runs base + adapters): finite loss, non-zero adapter
  gradient, KL near 0 at step 1 (quantisation error of the reference equals the policy's, both read the same
  dequantised base).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _common import metrics, run_train

# checkpoint.every=100: the runs' final checkpoints (step 2) are the only ones read
LORA = ("model.lora={rank: 4, alpha: 8}", "algorithm.kl.beta=0.1", "optimizer.lr=5e-2", "checkpoint.every=100")


def _param_keys(run: Path) -> set[str]:
    import orbax.checkpoint as ocp

    step_dirs = sorted((run / "checkpoints").glob("[0-9]*"), key=lambda p: int(p.name))
    meta = ocp.StandardCheckpointer().metadata(step_dirs[-1] / "params")
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    keys = set()

    def walk(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}")
        else:
            keys.add(prefix)

    walk(tree)
    return keys


@pytest.mark.slow
def test_lora_trains_adapters_only_against_the_base(tmp_path):
    run = tmp_path / "lora"
    proc = run_train(run, *LORA)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(run)
    assert abs(rows[0]["kl"]) < 1e-6 and rows[1]["kl"] > 1e-6
    assert all(r["train/grad_norm"] > 0 for r in rows)
    from jaxrl.io import lora_io

    lora_cfg, base = lora_io.read_adapter_config(run / "adapters")  # export-ready copy of the adapters
    assert lora_cfg.rank == 4 and len(base["sha256"]) == 64
    keys = _param_keys(run)
    assert keys and all(k.endswith("/lora_a") or k.endswith("/lora_b") for k in keys), sorted(keys)[:5]
    # a different base (the preset initialised from another seed) is refused on resume, in one line
    again = run_train(run, *LORA, "train.seed=1", "train.steps=3")
    assert again.returncode == 2, again.stderr[-2000:]
    assert "trained on a different base model" in again.stderr
    assert "Traceback" not in again.stderr


@pytest.mark.slow
def test_qlora_int8_base_trains(tmp_path):
    run = tmp_path / "qlora"
    proc = run_train(run, *LORA, "model.quantize=int8", "train.eval_every=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = [r for r in metrics(run) if "eval/accuracy" in r]  # evaluation samples base + adapters
    assert [r["step"] for r in evals] == [0, 2]
    rows = [r for r in metrics(run) if "kl" in r]
    assert abs(rows[0]["kl"]) < 1e-6 and all(r["train/grad_norm"] > 0 for r in rows)
    cfg = (run / "config.yaml").read_text()
    assert "quantize: int8" in cfg and json.dumps(rows[-1]["loss"]) != "NaN"
