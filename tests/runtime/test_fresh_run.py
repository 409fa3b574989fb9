"""A fresh run never mixes with an earlier one (issue 30, item 1): `checkpoint.resume=false` in a run
directory holding an earlier run's checkpoints or metrics is one line, exit 2, before anything is built or
written; `--overwrite-run` moves the earlier run aside to `RUN.old-<timestamp>` (never deletes it), and
refuses a run directory a live trainer holds."""

import json

import pytest

from jaxrl.cli import main
from jaxrl.errors import RunDirError
from jaxrl.runtime.run_dir import earlier_run, start_fresh_run
from jaxrl.runtime.run_lock import RunLock
from tests.runtime import _trainer as T


def _model_config() -> str:
    """The model_config.json a run of the tiny config saves (so a resume check alone would accept the run)."""
    import tempfile
    from pathlib import Path

    from jaxrl.io import build
    from jaxrl.io import model_io
    from jaxrl.config import load_config

    cfg = load_config(str(T.write_config(Path(tempfile.mkdtemp()))), [])
    tok = build.build_tokenizer(cfg.model, cfg.tokenizer)
    return json.dumps(model_io.config_to_json(build.preset_config(cfg.model, len(tok))))


def _earlier_run(run_dir):
    """An earlier run's layout (checkpoint step 5 of the same model, metrics rows); returns its files and
    their contents."""
    (run_dir / "checkpoints" / "5" / "params").mkdir(parents=True)
    (run_dir / "checkpoints" / "model_config.json").write_text(_model_config())
    (run_dir / "config.yaml").write_text("train: {steps: 5}\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 5}\n')
    return _files(run_dir)


def _files(root):
    return {str(p.relative_to(root)): (p.read_text() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("layout", ["checkpoints", "metrics_only"])
def test_resume_false_on_an_earlier_run_is_refused(tmp_path, capsys, layout):
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    if layout == "metrics_only":
        (run_dir / "checkpoints" / "5" / "params").rmdir()
        (run_dir / "checkpoints" / "5").rmdir()
        before = _files(run_dir)
    cfg = T.write_config(tmp_path)
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--set", "checkpoint.resume=false"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"jaxrl train: error: run directory {run_dir} holds an earlier run (")
    assert "use a new --run-dir, or --overwrite-run to move the earlier run aside (it is not deleted)" in err
    assert _files(run_dir) == before  # nothing written, nothing moved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "tiny.yaml"]


def test_resume_false_in_an_empty_or_new_run_dir_is_fine(tmp_path):
    assert earlier_run(tmp_path / "new") is None
    assert start_fresh_run(tmp_path / "new", overwrite=False) is None
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)  # a run that never saved a step or a metric
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    assert start_fresh_run(tmp_path / "empty", overwrite=False) is None


def test_overwrite_run_moves_the_earlier_run_aside(tmp_path):
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    moved = start_fresh_run(run_dir, overwrite=True)
    assert moved.parent == tmp_path and moved.name.startswith("run.old-")
    assert not run_dir.exists()
    after = _files(moved)
    assert after.pop(".jaxrl-train.lock") == ""  # taken for the move, released clean
    assert after == before
    _earlier_run(run_dir)
    again = start_fresh_run(run_dir, overwrite=True)  # same second: another name, the first kept
    assert again != moved and moved.is_dir() and again.is_dir()


def test_overwrite_run_refuses_a_run_dir_in_use(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _earlier_run(run_dir)
    cfg = T.write_config(tmp_path)
    with RunLock(run_dir):
        with pytest.raises(RunDirError, match="in use by another trainer"):
            start_fresh_run(run_dir, overwrite=True)
        assert main(["train", str(cfg), "--run-dir", str(run_dir), "--overwrite-run"]) == 2
        assert "in use by another trainer" in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "tiny.yaml"]


def test_overwrite_run_on_the_cli_starts_fresh(tmp_path, capsys):
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    cfg = T.write_config(tmp_path)
    argv = ["train", str(cfg), "--run-dir", str(run_dir), "--overwrite-run", "--set", "train.steps=0",
            "--set", "checkpoint.resume=false"]
    assert main(argv) == 0
    old = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(old) == 1
    kept = _files(old[0])
    kept.pop(".jaxrl-train.lock")
    assert kept == before
    assert not (run_dir / "checkpoints" / "5").exists() and (run_dir / "config.yaml").is_file()
