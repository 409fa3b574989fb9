"""Experiment trackers of `jaxrl train` (issue 31 item 1), with the real packages, offline / local:

* one tiny CLI run with `logging.trackers=[wandb, mlflow, tensorboard]` (2 steps), then the same command
  resumed to step 3;
* the values W&B (offline `.wandb` files, read with wandb's own protobuf records), MLflow (local file
  store, `MlflowClient.get_metric_history`) and TensorBoard (event files) hold equal `metrics.jsonl` step by
  step, key by key;
* the resumed invocation appended to the same W&B and MLflow runs (ids kept in RUN/trackers.json);
* each tracker got the resolved config and the samples as a table;
* a tracker whose package is missing is refused at setup with one line naming the extra (exit 2);
* `logging.trackers` and `logging.tensorboard` that contradict each other are refused.
"""

import json
import re
import struct
import subprocess
import sys

import pytest

from _common import ROOT, env, train_cmd

from jaxrl.config import load_config
from jaxrl.errors import ConfigError
from jaxrl.runtime.trackers import STATE_FILE, mlflow_key

wandb = pytest.importorskip("wandb")
pytest.importorskip("mlflow")
WANDB_OWN = ("_step", "_timestamp", "_runtime")
# logging.basicConfig's format in jaxrl/commands/train.py, from a jaxrl logger
OWN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) jaxrl(\.\w+)*: ")


def _tracker_env(tmp) -> dict[str, str]:
    e = env()
    e.pop("WANDB_DISABLED", None)  # tests/conftest.py disables W&B for every other test
    e.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp / "wandb_config"),
             WANDB_CACHE_DIR=str(tmp / "wandb_cache"), WANDB_DATA_DIR=str(tmp / "wandb_data"))
    return e


def _train(run_dir, e, *overrides) -> subprocess.CompletedProcess:
    cmd = train_cmd(run_dir, "logging.trackers=[wandb, mlflow, tensorboard]", "logging.tensorboard=null",
                    *overrides)
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trackers")
    e, run_dir = _tracker_env(tmp), tmp / "run"
    first = _train(run_dir, e, "train.steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    ids = json.loads((run_dir / STATE_FILE).read_text())
    resumed = _train(run_dir, e, "train.steps=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, ids, rows, resumed


def _numbers(row: dict) -> dict:
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _wandb_records(path):
    """The protobuf `Record`s of a `.wandb` file: a LevelDB-style log (7-byte header `:W&B` + magic + version,
    32 KiB blocks of chunks `crc32 u32 | length u16 | type u8`, types FULL 1, FIRST 2, MIDDLE 3, LAST 4)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a chunk header is zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_runs(run_dir) -> list[tuple[str, dict, dict]]:
    """(run id, config, {step: history values}) of each offline run directory, oldest first."""
    runs = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id, config, history = None, {}, {}
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
                config.update({c.key: json.loads(c.value_json) for c in record.run.config.update})
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                history.setdefault(items["_step"], {}).update(items)
        runs.append((run_id, config, history))
    return runs


def test_wandb_holds_every_metric_of_every_step_in_one_resumed_run(run):
    run_dir, ids, rows, _ = run
    runs = _wandb_runs(run_dir)
    assert [r[0] for r in runs] == [ids["wandb"]["run_id"]] * 2  # the resume appended to the same run id
    assert [sorted(r[2]) for r in runs] == [[1, 2], [3]]
    history = {step: values for r in runs for step, values in r[2].items()}
    for row in rows:
        logged = {k: v for k, v in history[row["step"]].items()
                  if k not in WANDB_OWN and not k.startswith("samples/")}
        assert logged == _numbers(row), row["step"]
        assert history[row["step"]]["samples/_type"] == "table-file"
        assert history[row["step"]]["samples/nrows"] == 2
    config = runs[1][1]
    assert config["train"]["steps"] == 3
    assert config["logging"]["trackers"] == ["wandb", "mlflow", "tensorboard"]


def test_wandb_samples_table_matches_samples_jsonl(run):
    run_dir = run[0]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    tables = sorted((run_dir / "wandb").glob("offline-run-*/files/media/table/samples_*.table.json"),
                    key=lambda p: int(p.name.split("_")[1]))
    logged = []
    for path in tables:
        table = json.loads(path.read_text())
        logged += [dict(zip(table["columns"], r)) for r in table["data"]]
    assert logged == samples and len(samples) == 6


def test_mlflow_holds_every_metric_of_every_step_in_one_resumed_run(run, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to open a file store
    from mlflow import MlflowClient

    run_dir, ids, rows, _ = run
    stored = ids["mlflow"]
    assert json.loads((run_dir / STATE_FILE).read_text())["mlflow"] == stored  # the resume reused the run
    assert stored["tracking_uri"] == (run_dir / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=stored["tracking_uri"])
    mlrun = client.get_run(stored["run_id"])
    assert mlrun.info.status == "FINISHED"
    keys = set().union(*(_numbers(r) for r in rows))
    assert set(mlrun.data.metrics) == {mlflow_key(k, file_store=True) for k in keys}
    for key in keys:
        points = client.get_metric_history(stored["run_id"], mlflow_key(key, file_store=True))
        history = [(m.step, m.value) for m in points]
        expected = [(r["step"], float(r[key])) for r in rows if key in _numbers(r)]
        assert sorted(history) == expected, key
    assert mlrun.data.params["train.steps"] == "2"  # params: the config the run was created with
    assert mlrun.data.params["logging.trackers"] == '["wandb", "mlflow", "tensorboard"]'
    artifacts = run_dir / "mlruns" / mlrun.info.experiment_id / stored["run_id"] / "artifacts"
    assert json.loads((artifacts / "config.json").read_text())["train"]["steps"] == 3  # this invocation's
    table = json.loads((artifacts / "samples.json").read_text())
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    logged = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [{**r, "reward": pytest.approx(r["reward"], abs=1e-9)} for r in samples] == logged  # 10 decimals


def _tensorboard(tb_dir) -> tuple[dict, dict]:
    """({tag: [(step, value)]} of the scalars, {tag: [step]} of the texts) of TFRecord event files."""
    from tensorboardX.proto import event_pb2

    scalars, texts = {}, {}
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):  # u64 length, u32 crc, payload, u32 crc
            n = int.from_bytes(data[pos:pos + 8], "little")
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 16 + n
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "text":
                    texts.setdefault(v.tag, []).append(event.step)
                elif v.HasField("simple_value"):
                    scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars, texts


def test_tensorboard_holds_every_metric_the_config_and_the_samples(run):
    run_dir, _, rows, _ = run
    scalars, texts = _tensorboard(run_dir / "tb")
    keys = set().union(*(_numbers(r) for r in rows))
    assert set(scalars) == keys
    for key in keys:  # TensorBoard keeps float32
        expected = [(r["step"], pytest.approx(r[key], rel=1e-6, abs=1e-30))
                    for r in rows if key in _numbers(r)]
        assert scalars[key] == expected, key
    assert texts == {"config/text_summary": [0, 2], "samples/text_summary": [1, 2, 3]}


def test_resume_logs_where_the_runs_are_and_no_foreign_lines(run):
    run_dir, ids, _, resumed = run
    where = run_dir / "wandb"
    assert (f"W&B: run {ids['wandb']['run_id']} (offline) in {where}; upload it with `wandb sync "
            f"{where}/offline-run-*`") in resumed.stderr
    assert f"MLflow: run {ids['mlflow']['run_id']} in {ids['mlflow']['tracking_uri']}" in resumed.stderr
    foreign = [line for line in resumed.stderr.splitlines() if not OWN_LINE.match(line)]
    assert not foreign, foreign  # neither wandb's banner nor MLflow's download bars


def test_missing_tracker_package_is_refused_at_setup(tmp_path):
    site = tmp_path / "no_mlflow"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    e = _tracker_env(tmp_path)
    e["PYTHONPATH"] = f"{site}:{e['PYTHONPATH']}"
    run_dir = tmp_path / "run"
    proc = subprocess.run(train_cmd(run_dir, "logging.trackers=[mlflow]"), cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [  # one line, before any model or file
        "jaxrl train: error: logging.trackers names mlflow but the mlflow package is not installed: "
        "pip install 'jaxrl[mlflow]' (or remove mlflow from logging.trackers)"]
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize("overrides, message", [
    (["logging.trackers=[wandb]", "logging.tensorboard=true"],
     "logging.tensorboard=True: contradicts logging.trackers=['wandb']; drop one of the two"),
    (["logging.trackers=[tensorboard]", "logging.tensorboard=false"],
     "logging.tensorboard=False: contradicts logging.trackers=['tensorboard']"),
    (["logging.trackers=[tensorboard]", "logging.mlflow.experiment=x"],
     "logging.mlflow holds options of a tracker that logging.trackers=['tensorboard'] does not name"),
    (["logging.trackers=[neptune]"], "logging.trackers[0]='neptune': allowed values are 'tensorboard', "),
])
def test_contradicting_tracker_keys_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, overrides)


def test_trackers_follow_the_older_keys_when_not_given():
    assert load_config(None, []).logging.trackers == ("tensorboard",)
    assert load_config(None, ["logging.tensorboard=false"]).logging.trackers == ()
    cfg = load_config(None, ["logging.wandb.project=demo"]).logging
    assert cfg.trackers == ("tensorboard", "wandb") and cfg.wandb.project == "demo" and cfg.mlflow is None
    cfg = load_config(None, ["logging.trackers=[mlflow]"]).logging
    assert cfg.tensorboard is False and cfg.mlflow.experiment == "jaxrl" and cfg.wandb is None


def test_tensorboard_writer_does_not_import_torch_and_torch_still_imports_after():
    """tensorboardX tries `import torch` at import (3 s of every start where torch is installed, as in this
    test environment); jaxrl's import of it must not load torch, nor stop a later `import torch`."""
    pytest.importorskip("torch")
    code = ("import sys; from jaxrl.runtime.trackers import summary_writer_class; summary_writer_class(); "
            "print('torch' in sys.modules, 'torch' in sys.modules and sys.modules['torch'] is None); "
            "import torch; print(torch.ones(2).sum().item())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "2.0"]
