"""A resume this config cannot do fails before anything in the run directory is written: exit 2, one line
naming every differing field; config.yaml and model_config.json stay byte-identical and the original
checkpoints still sample. (The trainer used to rewrite both files first, then fail on a shape mismatch.)"""

import pytest

from jaxrl.cli import main
from tests.runtime import _trainer as T


@pytest.mark.slow
def test_changed_model_on_resume_exits_2_and_leaves_the_run_intact(tmp_path, capsys):
    cfg, run_dir = T.write_config(tmp_path), tmp_path / "run"
    first = T.run(T.train_argv(cfg, run_dir))
    assert first.returncode == 0, first.stderr[-3000:]
    files = [run_dir / "config.yaml", run_dir / "checkpoints" / "model_config.json"]
    before = [f.read_bytes() for f in files]
    steps_before = T.steps_in(run_dir)

    bad = T.run(T.train_argv(cfg, run_dir, "train.steps=4", "model.overrides.num_layers=2",
                             "algorithm.name=dapo"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    line = bad.stderr.strip().splitlines()[-1]
    assert line.startswith(f"jaxrl train: error: cannot resume the run in {run_dir} with this config: ")
    assert "model num_layers: 1 in the run, 2 in this config" in line
    assert "algorithm.name: 'grpo' in the run, 'dapo' in this config" in line
    assert [f.read_bytes() for f in files] == before and T.steps_in(run_dir) == steps_before

    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "1+2=", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    assert "=== prompt 0 sample 0" in capsys.readouterr().out
