"""Helper scripts never overwrite tracked files by default (issue 30, item 9): `docs/agentic_curve.py` writes
into the run directory unless `--out` names another path."""

import hashlib
import importlib.util
import json

from tests.conftest import REPO


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_agentic_curve_writes_into_the_run_dir_by_default(tmp_path, capsys):
    tracked = REPO / "docs" / "agentic_search_tiny.png"
    before = _digest(tracked)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"step": s, "eval/accuracy": 0.1 * s, "reward/mean": 0.2, "episode/tool_calls": 1.0}
            for s in (0, 1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = _load(REPO / "docs" / "agentic_curve.py")
    assert curve.main([str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "agentic_search.png")
    assert (run_dir / "agentic_search.png").stat().st_size > 0
    assert _digest(tracked) == before
    assert curve.main([str(run_dir), "--out", str(tmp_path / "given.png")]) == 0
    assert (tmp_path / "given.png").is_file()
