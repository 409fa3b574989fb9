"""`--run-dir gs://…` without gcsfs: refused as the arguments are parsed, one line naming the extra, exit 2
(issue 30 item 7); before, `jaxrl train` went on and failed with an ImportError traceback."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# gcsfs hidden even where it is installed: the refusal must not depend on this machine's packages
NO_GCSFS = ("import sys; sys.modules['gcsfs'] = None; from jaxrl.cli import main; "
            "sys.exit(main(sys.argv[1:]))")


def test_gs_run_dir_without_gcsfs_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", NO_GCSFS, "train", "--run-dir", "gs://bucket/run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "gs://bucket/run" in lines[0] and "jaxrl[gcs]" in lines[0]
