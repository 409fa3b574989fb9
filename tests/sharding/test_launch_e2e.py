"""`jaxrl launch` end to end against a fake `gcloud` whose TPU workers are local processes.

launch -> package (git archive) -> create -> copy -> install -> start 2 workers (a 2-host pod: jax.distributed
over localhost) -> SIGTERM to both trainers after a checkpoint (a spot preemption notice) -> training exits 75
-> the supervisor restarts it -> it resumes and finishes -> launch exits 0. `fake_gcloud.py` says what is
faked; the install step uses this interpreter instead of downloading jaxrl's dependencies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# tests/suite.py runs these alone: a 2-worker fake pod keeps both cores busy.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_gcloud.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_config(path: Path) -> None:
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    cfg["model"]["overrides"] = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
                                 "head_dim": 16, "mlp_dim": 64}
    cfg["sft_warmup"]["steps"] = 0
    cfg["train"].update(steps=3, eval_every=0)
    cfg["data"].update(prompts_per_step=4, eval_size=8, train_size=200)
    cfg["rollout"].update(group_size=2, max_new_tokens=8, gen_buckets=[8])
    cfg["logging"].update(progress_bar=False, tensorboard=False)
    cfg["checkpoint"]["every"] = 1
    path.write_text(yaml.safe_dump(cfg))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_launch_preemption_relaunch_resume(tmp_path):
    bin_dir, state, run_dir = tmp_path / "bin", tmp_path / "vm", tmp_path / "run"
    bin_dir.mkdir()
    state.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f"#!{sys.executable}\nimport runpy\n"
                      f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    gcloud.chmod(0o755)
    config = tmp_path / "tiny.yaml"
    _tiny_config(config)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_GCLOUD_ROOT=str(state),
               FAKE_COORDINATOR=f"127.0.0.1:{_free_port()}", FAKE_WORKERS="2", FAKE_DEVICES="2")
    for k in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    launch = subprocess.Popen(
        [sys.executable, "-m", "jaxrl.cli", "launch", str(config), "--tpu", "t", "--zone", "z",
         "--accelerator-type", "v4-16", "--run-dir", str(run_dir), "--max-restarts", "2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 900
        while not (1 in _steps(run_dir) and (run_dir / "checkpoints" / "1").is_dir()):
            assert launch.poll() is None, launch.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint of step 1"
            time.sleep(0.5)
        trainers = [c for i in range(2)
                    for c in _children(int((state / f"w{i}" / "jaxrl-run" / "train.pid").read_text()))]
        assert len(trainers) == 2, trainers
        for pid in trainers:  # the preemption notice reaches every worker
            os.kill(pid, signal.SIGTERM)
        out, _ = launch.communicate(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 0, out[-4000:]
    assert "training was stopped by SIGTERM (exit 75" in out, out[-4000:]
    assert "resumed from step" in (state / "w0" / "jaxrl-run" / "train.log").read_text()
    assert _steps(run_dir) == [1, 2, 3]  # each step once, across the preemption
