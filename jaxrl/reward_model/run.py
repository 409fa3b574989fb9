"""The `jaxrl train-rm` loop: build tokenizer, model and data from an `RMExperimentConfig`, train, evaluate.

Run directory (same layout and rules as `jaxrl train`):
    RUN/config.yaml                 resolved config
    RUN/metrics.jsonl (+ tb/)       per-step metrics (`rm/*`, `dir/*`) and eval rows (`eval/*`)
    RUN/checkpoints/                model_config.json, reward_model.json, tokenizer/
    RUN/checkpoints/<step>/         params, opt_state ({rm, clf, clf_opt}), extra
    RUN/eval_rm.json                the final `evaluate_pairs` report on the held-out set
Resume: with `checkpoint.resume`, the newest restorable step is loaded (RM params, both optimiser states and
the classifier); batches are a pure function of (seed, step), so a resumed run sees the same batches.

Multi-host (`jaxrl train-rm ... --coordinator --num-processes --process-id`): every process builds the same
data and the same initial state; the step is data-parallel over every device of every host (the batch split
over a `data` mesh axis, the state replicated, gradients reduced by XLA), so each host computes only its
rows. Evaluation runs on each host's copy of the replicated parameters (the same report everywhere);
process 0 alone writes config.yaml, the metrics and eval_rm.json, and orbax writes the checkpoints. A single
process keeps its state on its default device.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxrl.io import model_io
from jaxrl.io.checkpoint import Checkpointer
from jaxrl.errors import ConfigError
from jaxrl.config import config_dict
from jaxrl.runtime.metrics import MetricsWriter
from jaxrl.runtime.trackers import make_trackers
from jaxrl.learner.optim import build_optimizer
from jaxrl.reward_model import data as data_lib
from jaxrl.reward_model.config import RMExperimentConfig, dump_rm_config
from jaxrl.reward_model.evaluate import evaluate_pairs
from jaxrl.reward_model.model import RM_MARKER, RewardModel, load_reward_model, write_marker
from jaxrl.reward_model.train import (Batch, RMState, debias_gamma, init_classifier,
                                      make_train_step)
from jaxrl.sharding.hosts import place_global
from jaxrl.io.tokenizer import load_tokenizer

log = logging.getLogger(__name__)
EVAL_FILE = "eval_rm.json"


def build_model(cfg: RMExperimentConfig, tokenizer) -> RewardModel:
    """A preset (random init), an HF LM / RM directory, or a jaxrl LM / RM checkpoint, as a `RewardModel`."""
    from jaxrl.io.build import model_config  # the shared preset table of `jaxrl.config.ModelConfig`

    m = cfg.model
    pad = tokenizer.pad_token_id
    if m.checkpoint is not None and (model_io.resolve_checkpoint(m.checkpoint)[0] / RM_MARKER).is_file():
        model = load_reward_model(m.checkpoint)[0]
    elif m.hf_path is not None and "ForSequenceClassification" in str(_hf_arch(m.hf_path)):
        from jaxrl.reward_model.export import import_reward_model

        model = import_reward_model(m.hf_path, dtype=m.dtype)
    elif m.preset is not None:
        model = RewardModel(model_config(m).replace(pad_token_id=pad), rngs=nnx.Rngs(cfg.train.seed))
    else:
        backbone, _ = model_io.load_model(m.hf_path or m.checkpoint, dtype=m.dtype)
        model = RewardModel.from_backbone(backbone, pad, seed=cfg.train.seed)
    if len(tokenizer) > model.cfg.vocab_size:
        raise ConfigError(f"model vocab_size={model.cfg.vocab_size} is smaller than the tokenizer's "
                          f"{len(tokenizer)} tokens; set model.overrides.vocab_size >= {len(tokenizer)}")
    if model.cfg.pad_token_id != pad:
        raise ConfigError(f"the model's pad_token_id={model.cfg.pad_token_id} differs from the "
                          f"tokenizer's {pad}")
    return model


def _hf_arch(path: str) -> Any:
    file = Path(path) / "config.json"
    try:
        return (json.loads(file.read_text()).get("architectures") or [None])[0]
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"model.hf_path: cannot read {file}: {e}") from None


def load_data(cfg: RMExperimentConfig) -> tuple[list[dict], list[dict]]:
    """(train records, eval records) of `cfg.data` (see `RMDataConfig`)."""
    d = cfg.data
    if d.source == "synthetic":
        train = data_lib.synthetic_pairs(d.train_size, d.seed, chosen_decorated_rate=d.chosen_longer_rate,
                                         **d.params)
        held = data_lib.synthetic_pairs(d.eval_size, d.seed + 1, chosen_decorated_rate=0.5, **d.params)
        return train, held
    fields = dict(prompt_field=d.prompt_field, chosen_field=d.chosen_field, rejected_field=d.rejected_field)
    records = data_lib.load_pairs(d.source, **fields)
    if d.eval_source is not None:
        return records[:d.train_size], data_lib.load_pairs(d.eval_source, **fields)
    if len(records) <= d.eval_size:
        raise ConfigError(f"data.eval_size={d.eval_size} leaves no training pairs of the {len(records)} in "
                          f"{d.source}; lower it or set data.eval_source")
    order = np.random.default_rng(d.seed).permutation(len(records))
    held = [records[i] for i in order[:d.eval_size]]
    return [records[i] for i in order[d.eval_size:]][:d.train_size], held


def train_rm(cfg: RMExperimentConfig, run_dir: str | Path) -> dict[str, Any]:
    """Trains a reward model into `run_dir`; returns the final evaluation report (also in
    RUN/eval_rm.json)."""
    run_dir = Path(run_dir)
    primary = jax.process_index() == 0
    if primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_rm_config(cfg))
    tokenizer = load_tokenizer(cfg.tokenizer.kind, cfg.tokenizer.path)
    model = build_model(cfg, tokenizer)
    train_records, eval_records = load_data(cfg)
    train = data_lib.encode_pairs(train_records, tokenizer, cfg.data.max_len)
    held = data_lib.encode_pairs(eval_records, tokenizer, cfg.data.max_len)
    if train.dropped or held.dropped:
        log.warning("dropped %d training / %d eval pairs longer than data.max_len=%d", train.dropped,
                    held.dropped,
                    cfg.data.max_len)

    graphdef, params = nnx.split(model, nnx.Param)
    params = params.to_pure_dict()
    steps, debias = cfg.train.steps, cfg.debias
    optimizer = build_optimizer(cfg.optimizer, steps)
    clf, clf_opt = (init_classifier(debias, model.cfg.hidden_size, jax.random.key(cfg.train.seed + 1))
                    if debias.enabled else ({}, ()))
    mesh = _data_mesh(cfg.data.batch_size)
    state = _place(RMState(params, optimizer.init(params), clf, clf_opt), mesh, P())
    ck = cfg.checkpoint
    checkpointer = Checkpointer(run_dir / "checkpoints", every=ck.every, keep=ck.keep,
                                async_save=ck.async_save)
    checkpointer.write_model_config(model_io.config_to_json(model.cfg), tokenizer)
    if primary:
        write_marker(checkpointer.directory)
    start = 0
    if ck.resume:
        restored = checkpointer.restore_latest(state.params, _opt_item(state))
        if restored is not None:
            start = restored.step
            opt = restored.opt_state
            state = RMState(restored.params, opt["rm"], opt["clf"], opt["clf_opt"])
            log.info("resumed from step %d", start)

    step_fn = make_train_step(graphdef, optimizer, debias)
    attr = train.attributes[debias.attribute]
    every = cfg.train.eval_every
    trackers = make_trackers(cfg.logging.trackers, run_dir, resume_step=start, config=config_dict(cfg),
                             wandb=cfg.logging.wandb, mlflow=cfg.logging.mlflow) if primary else []
    with MetricsWriter(run_dir, resume_step=start, total_steps=steps if cfg.logging.progress_bar else None,
                       tensorboard=False, trackers=trackers, postfix_keys=("rm/loss", "rm/acc")) as writer:
        for step in range(start, steps):
            idx = data_lib.batch_indices(step, len(train.records), cfg.data.batch_size, cfg.data.seed)
            batch = _place(Batch(train.chosen_BL[idx], train.rejected_BL[idx], attr[idx]), mesh, P("data"))
            state, metrics = step_fn(state, batch, np.float32(debias_gamma(debias, step)))
            done = step + 1
            row = dict(jax.device_get(metrics)) if done % cfg.logging.every == 0 or done == steps else {}
            if every and done % every == 0 and done != steps:
                report = evaluate_pairs(_local_model(graphdef, state.params, mesh), held)
                row.update(_eval_metrics(report, debias.attribute))
            if row:
                writer.write(done, row)
            if checkpointer.should_save(done) or done == steps:
                checkpointer.save(done, state.params, _opt_item(state), {"data_seed": cfg.data.seed})
        report = evaluate_pairs(_local_model(graphdef, state.params, mesh), held)
        writer.write(max(steps, start), _eval_metrics(report, debias.attribute))
    checkpointer.close()
    if primary:
        (run_dir / EVAL_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _data_mesh(batch_size: int) -> Mesh | None:
    """Multi-host: a `data` mesh over every device of every process; one process: None (default device)."""
    if jax.process_count() == 1:
        return None
    if batch_size % jax.device_count():
        raise ConfigError(f"data.batch_size={batch_size}: a multi-host train-rm splits each batch over all "
                          f"{jax.device_count()} devices; use a multiple of {jax.device_count()}")
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))


def _place(tree: Any, mesh: Mesh | None, spec: P) -> Any:
    """`tree` as global arrays with `spec` on `mesh` (every process holds the same values); as is without."""
    return tree if mesh is None else place_global(tree, NamedSharding(mesh, spec))


def _local_model(graphdef: nnx.GraphDef, params: Any, mesh: Mesh | None) -> RewardModel:
    """The model on this process's default device (a replicated global state is fetched whole)."""
    return nnx.merge(graphdef, params if mesh is None else jax.device_get(params))


def _opt_item(state: RMState) -> dict[str, Any]:
    return {"rm": state.opt_state, "clf": state.clf, "clf_opt": state.clf_opt}


def _eval_metrics(report: dict[str, Any], attribute: str) -> dict[str, float]:
    stats = report["attributes"][attribute]
    return {"eval/accuracy": report["accuracy"], f"eval/{attribute}_correlation": stats["correlation"],
            f"eval/{attribute}_mi_nats": stats["mi_nats"]}
