"""Experiment trackers beside RUN/metrics.jsonl: TensorBoard, Weights & Biases, MLflow (`logging.trackers`).

Each tracker gets the resolved config once, every step's numeric metrics with their step, and the logged
samples as a table (W&B: a `wandb.Table` under `samples`; MLflow: the artifact `samples.json` via
`log_table`, one row per completion; TensorBoard: a Markdown table under the text tag `samples`, the config
under `config`).
`make_trackers` is the one factory: `jaxrl.runtime.metrics.MetricsWriter` calls the trackers it returns; only the
primary process (`jax.process_index() == 0`) gets any.

A resumed run continues the same tracker run: the W&B and MLflow run ids are kept in RUN/trackers.json
(written atomically) and reused by every later invocation in that run directory. W&B offline mode writes
one `RUN/wandb/offline-run-*` directory per invocation, all with that id; `wandb sync` uploads them in order
of start time into the one run. MLflow reopens the run by id.

Deviations and honest limits:
* MLflow 3 refuses its file store unless `MLFLOW_ALLOW_FILE_STORE=true` (the store is in maintenance mode;
  the database stores need the full `mlflow` package with SQLAlchemy). For a `file:` tracking URI this
  module sets that variable in its own process when it is unset.
* In MLflow's local file store metric names use `.` where jaxrl's use `/` (`pg.loss`): that store keeps a
  metric in a file named by its key, and `entropy` beside `entropy/mean` would be a file and a directory of
  the same name. A tracking server keeps jaxrl's names.
* Config values become MLflow params once, when the run is created (MLflow forbids changing a param);
  every invocation also stores its resolved config as the artifact `config.json`, so a resume with more
  steps shows there.
* Steps that a killed run logged after its last checkpoint are logged again on resume (with the same values,
  except timings: a resumed run repeats exactly those steps). TensorBoard purges them; MLflow keeps both
  points of such a step; W&B gets such a step twice, in two invocations' records, and its server decides.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from jaxrl.errors import UserError

if TYPE_CHECKING:
    from jaxrl.config import MlflowConfig, WandbConfig

STATE_FILE = "trackers.json"
TB_DIR = "tb"
# tracker name -> (module it imports, extra that installs it); TensorBoard's tensorboardX is a core dependency
PACKAGES = {"tensorboard": ("tensorboardX", None), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow")}
_MLFLOW_PARAM_LEN = 6000  # MLflow's limit on a param value
_MLFLOW_BAD_KEY = re.compile(r"[^\w\-. :/]")  # MLflow names: alphanumerics, _ - . space : /
log = logging.getLogger(__name__)


class Tracker(Protocol):
    """One experiment tracker of a run."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records numeric scalars at `step`."""

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Records sample completions (`step`, `prompt`, `completion`, `reward` per row) as a table."""

    def close(self) -> None:
        """Flushes and ends this invocation's part of the run."""


def check_installed(names: Sequence[str]) -> None:
    """Raises UserError, naming the extra to install, for a tracker whose package cannot be imported."""
    for name in names:
        module, extra = PACKAGES[name]
        if extra is not None and importlib.util.find_spec(module) is None:
            raise UserError(f"logging.trackers names {name} but the {module} package is not installed: "
                            f"pip install 'jaxrl[{extra}]' (or remove {name} from logging.trackers)")


def make_trackers(names: Sequence[str], run_dir: str | os.PathLike, *, resume_step: int = 0,
                  config: Mapping[str, Any] | None = None, wandb: WandbConfig | None = None,
                  mlflow: MlflowConfig | None = None) -> list[Tracker]:
    """The trackers `names` (any of "tensorboard", "wandb", "mlflow") of the run in `run_dir`.

    Call it on the primary process only. W&B and MLflow continue the run ids stored in RUN/trackers.json and
    store new ones there.

    Args:
      names: the trackers, in order.
      run_dir: the run directory (local).
      resume_step: the step training restarts after (TensorBoard purges its later events).
      config: the resolved config as plain data.
      wandb: W&B options (`WandbConfig`; defaults when None).
      mlflow: MLflow options (`MlflowConfig`; defaults when None).
    Raises:
      UserError: a tracker's package is missing (before anything is written).
    """
    from jaxrl.config import MlflowConfig, WandbConfig

    check_installed(names)
    wandb, mlflow = wandb or WandbConfig(), mlflow or MlflowConfig()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = _read_state(run_dir)
    config = dict(config or {})
    made: list[Tracker] = []
    try:
        for name in names:
            made.append(_make(name, run_dir, state, resume_step, config, wandb, mlflow))
            if state:  # as soon as a run id exists: a run killed later still resumes it
                _write_state(run_dir, state)
    except BaseException:
        for tracker in made:  # the ones already started end cleanly
            tracker.close()
        raise
    return made


def _make(name: str, run_dir: Path, state: dict[str, Any], resume_step: int, config: dict[str, Any],
          wandb: WandbConfig, mlflow: MlflowConfig) -> Tracker:
    """One tracker; W&B and MLflow put their run id into `state` (RUN/trackers.json's contents)."""
    if name == "tensorboard":
        return TensorBoardTracker(run_dir / TB_DIR, resume_step, config)
    if name == "wandb":
        tracker = WandbTracker(run_dir, wandb, config, state.get("wandb", {}).get("run_id"))
        state["wandb"] = {"run_id": tracker.run_id}
        where = run_dir / "wandb"
        sync = f"; upload it with `wandb sync {where}/offline-run-*`" if wandb.mode == "offline" else ""
        log.info("W&B: run %s (%s) in %s%s", tracker.run_id, wandb.mode, where, sync)
        return tracker
    if name == "mlflow":
        uri = mlflow.tracking_uri or (run_dir / "mlruns").resolve().as_uri()
        stored = state.get("mlflow", {})
        tracker = MlflowTracker(uri, mlflow, config,
                                stored.get("run_id") if stored.get("tracking_uri") == uri else None)
        state["mlflow"] = {"run_id": tracker.run_id, "tracking_uri": uri}
        log.info("MLflow: run %s in %s", tracker.run_id, uri)
        return tracker
    raise ValueError(f"unknown tracker {name!r}: allowed are {', '.join(PACKAGES)}")


def _read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_state(run_dir: Path, state: Mapping[str, Any]) -> None:
    tmp = run_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, run_dir / STATE_FILE)


def _markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    columns = list(rows[0])
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows])


def summary_writer_class():
    """tensorboardX's `SummaryWriter`, imported without importing torch.

    tensorboardX tries `import torch` when it is imported, only to accept torch tensors (jaxrl passes floats
    and strings); where torch is installed (any environment that also converts checkpoints with
    transformers) that import took 3 s of every `jaxrl train` start. Unless torch is already loaded, the
    import sees torch as absent (a `None` entry in `sys.modules`, removed again at once), so tensorboardX
    keeps its numpy path and a later `import torch` elsewhere is unaffected.
    """
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class TensorBoardTracker:
    """TensorBoard event files (tensorboardX); on resume, events after `resume_step` are purged. The config
    is the text `config` at `resume_step` (the steps after it ran with that config)."""

    def __init__(self, log_dir: Path, resume_step: int, config: Mapping[str, Any] | None = None):
        self._writer = summary_writer_class()(str(log_dir), purge_step=resume_step + 1)
        if config:  # indented: a Markdown code block
            text = json.dumps(config, indent=2)
            self._writer.add_text("config", "    " + text.replace("\n", "\n    "), resume_step)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._writer.add_text("samples", _markdown(rows), step)

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A W&B run with its files in RUN/wandb, resumed by id (`resume="allow"`)."""

    def __init__(self, run_dir: Path, opts: WandbConfig, config: dict[str, Any], run_id: str | None):
        import wandb

        self._wandb = wandb
        # silent: jaxrl logs where the run is; console off: no second copy of stdout inside the run
        self._run = wandb.init(project=opts.project, entity=opts.entity, name=opts.name, mode=opts.mode,
                               dir=str(run_dir), id=run_id or secrets.token_hex(6), resume="allow",
                               config=config, settings=wandb.Settings(silent=True, console="off"))
        self.run_id = self._run.id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            columns = list(rows[0])
            table = self._wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
            self._run.log({"samples": table}, step=step)

    def close(self) -> None:
        self._run.finish()


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b": "value"} (lists and null as JSON)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


def mlflow_key(key: str, *, file_store: bool) -> str:
    """A metric or param name MLflow accepts (other characters become `_`); in a file store `/` becomes `.`
    (the store keeps a metric in a file named by its key, so `entropy` and `entropy/mean` cannot both be
    stored with `/`, a directory separator)."""
    key = _MLFLOW_BAD_KEY.sub("_", key)
    return key.replace("/", ".") if file_store else key


class MlflowTracker:
    """An MLflow run (client API, no global active run), reopened by id on resume."""

    def __init__(self, tracking_uri: str, opts: MlflowConfig, config: dict[str, Any], run_id: str | None):
        self._file_store = tracking_uri.startswith("file:")
        if self._file_store:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # see the module docstring
        # log_table downloads the table to append to it: no "Downloading artifacts" bar frames in a log file
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param, RunStatus

        self._metric, self._client = Metric, MlflowClient(tracking_uri=tracking_uri)
        if run_id is None:
            experiment = self._client.get_experiment_by_name(opts.experiment)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self._client.create_experiment(opts.experiment))
            run_id = self._client.create_run(experiment_id, run_name=opts.run_name).info.run_id
            params = [Param(self._key(k), v[:_MLFLOW_PARAM_LEN]) for k, v in _flat(config).items()]
            self._client.log_batch(run_id, params=params)
        else:
            self._client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        self.run_id = run_id
        self._client.log_dict(run_id, config, "config.json")

    def _key(self, key: str) -> str:
        return mlflow_key(key, file_store=self._file_store)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[
            self._metric(self._key(k), float(v), now, step) for k, v in metrics.items()])

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:  # log_table appends to the artifact's earlier rows
            self._client.log_table(self.run_id, data={c: [r[c] for r in rows] for c in rows[0]},
                                   artifact_file="samples.json")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
