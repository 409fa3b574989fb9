"""export-hf / import-hf never delete what they did not write: `--out` is checked before any model loads, a
run or checkpoint directory or a directory with foreign files is refused (exit 2, one line naming them), and
`--overwrite` replaces only the files the exporter writes."""

import json
import shutil

import pytest
from flax import nnx

from jaxrl.io import model_io
from jaxrl.cli import main
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.io.tokenizer import builtin_tokenizer


@pytest.fixture
def ckpt(tmp_path):
    tok = builtin_tokenizer()
    model = Transformer(TransformerConfig.tiny(vocab_size=len(tok), num_layers=1), rngs=nnx.Rngs(0))
    return model_io.save_model_checkpoint(model, tmp_path / "ckpt", tokenizer=tok)


def _fake_run(root):
    """A training run's layout: config.yaml, metrics.jsonl, checkpoints/{model_config.json, 2/}."""
    (root / "checkpoints" / "2" / "params").mkdir(parents=True)
    (root / "checkpoints" / "model_config.json").write_text("{}")
    (root / "config.yaml").write_text("train: {steps: 2}\n")
    (root / "metrics.jsonl").write_text('{"step": 1}\n')
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("target", ["run", "run/checkpoints"])
def test_export_into_a_run_is_refused_even_with_overwrite(tmp_path, ckpt, capsys, target):
    before = _fake_run(tmp_path / "run")
    out = tmp_path / target
    assert main(["export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--overwrite"]) == 2
    err = _err_line(capsys)
    assert f"--out {out} is a" in err and ("training run directory" in err or "trainer checkpoint" in err)
    assert sorted(str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run").rglob("*")) == before


def test_import_into_a_run_is_refused_before_loading(tmp_path, capsys):
    before = _fake_run(tmp_path / "run")
    (tmp_path / "hf").mkdir()  # no config.json: loading it would fail with another message
    argv = ["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"), "--overwrite"]
    assert main(argv) == 2
    assert "is a training run directory" in _err_line(capsys)
    assert sorted(str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run").rglob("*")) == before


def test_foreign_files_are_named_and_kept(tmp_path, ckpt, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "config.json").write_text("{}")
    assert main(["export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--overwrite"]) == 2
    assert "holds files this command does not write (notes.txt)" in _err_line(capsys)
    assert (out / "notes.txt").read_text() == "mine" and (out / "config.json").read_text() == "{}"


def test_overwrite_replaces_only_exporter_files(tmp_path, ckpt, capsys):
    out = tmp_path / "out"
    assert main(["export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--max-shard-size", "20KB"]) == 0
    sharded = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in sharded and "model.safetensors" not in sharded
    assert main(["export-hf", "--checkpoint", str(ckpt), "--out", str(out)]) == 2  # no --overwrite
    assert "already exists and is not empty; pass --overwrite" in _err_line(capsys)
    assert main(["export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--overwrite"]) == 0
    now = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in now and not [n for n in now if n.startswith("model-")]  # old shards gone
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "out"]  # no temporary leftovers


def test_import_overwrite_of_a_previous_import(tmp_path, ckpt, capsys):
    assert main(["export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    target = tmp_path / "imported"
    assert main(["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(target)]) == 0
    assert main(["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(target), "--overwrite"]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["model_config.json", "params", "tokenizer"]
    shutil.copy(tmp_path / "hf" / "config.json", target / "config.json")  # not something import-hf writes
    assert main(["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(target), "--overwrite"]) == 2
    assert "(config.json)" in _err_line(capsys)


@pytest.mark.parametrize("cmd", ["export-hf", "import-hf"])
def test_out_under_a_file_is_one_line(tmp_path, ckpt, capsys, cmd):
    (tmp_path / "afile").write_text("x")
    src = ["--checkpoint", str(ckpt)] if cmd == "export-hf" else ["--hf", str(tmp_path)]
    assert main([cmd, *src, "--out", str(tmp_path / "afile" / "sub")]) == 2
    assert f"{tmp_path / 'afile'} is a file, not a directory" in _err_line(capsys)
    assert main([cmd, *src, "--out", str(tmp_path / "afile")]) == 2
    assert "exists and is not a directory" in _err_line(capsys)
