"""jaxrl.distributed: argument/env resolution, two real processes on localhost, and a peer that never comes."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl.distributed import ClusterSpec, resolve
from jaxrl.errors import UserError

WORKER = Path(__file__).with_name("dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPU_WORKER_HOSTNAMES"):
        env.pop(k, None)
    return env


def test_resolve_sources():
    assert resolve(env={}) is None
    assert resolve(env={"TPU_WORKER_HOSTNAMES": "localhost"}) is None
    assert resolve(env={"TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2"}) == ClusterSpec(auto=True)
    assert resolve("h:1", 4, 2, env={}) == ClusterSpec(False, "h:1", 4, 2)
    env = {"JAX_COORDINATOR_ADDRESS": "10.1.1.1:8476", "JAX_NUM_PROCESSES": "8", "JAX_PROCESS_ID": "3"}
    assert resolve(env=env) == ClusterSpec(False, "10.1.1.1:8476", 8, 3)
    assert resolve(process_id=5, env=env) == ClusterSpec(False, "10.1.1.1:8476", 8, 5)  # args win
    assert resolve("h:1", 1, 0, env={}) is None  # one process: nothing to initialise


@pytest.mark.parametrize(
    "args, message",
    [
        (("h:1", None, 0), r"missing --num-processes"),
        ((None, 2, None), r"missing --coordinator, --process-id"),
        (("h", 2, 0), r"--coordinator='h': expected HOST:PORT"),
        (("h:1", 2, 2), r"--process-id=2: must be in \[0, 2\) for 2 processes"),
        (("h:1", 0, 0), r"--num-processes=0: must be >= 1"),
    ],
)
def test_resolve_errors(args, message):
    with pytest.raises(UserError, match=message):
        resolve(*args, env={})


def test_bad_env_integer():
    with pytest.raises(UserError, match=r"JAX_NUM_PROCESSES='two' must be an integer"):
        resolve(env={"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"})


def test_two_processes_psum_and_orbax_roundtrip(tmp_path):
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(pid), "2", str(port), str(tmp_path)],
            env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for pid in range(2)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    expected_sum = float(sum(range(24)))  # every element of the 8x3 global array, once
    for pid, o in enumerate(outs):
        assert o["process_index"] == pid and o["process_count"] == 2 and o["global_devices"] == 4
        assert o["psum"] == expected_sum
        assert o["restored_ok"]
        assert o["primary"] == (pid == 0)
    # each process holds different rows of the global array
    assert outs[0]["local_rows"] == [0, 2] and outs[1]["local_rows"] == [4, 6]
    assert sorted(p.name for p in (tmp_path / "state").glob("ocdbt.process_*")) == [
        "ocdbt.process_0", "ocdbt.process_1",
    ]


@pytest.mark.parametrize("process_id", [0, 1])
def test_missing_peer_exits_with_clear_message_within_timeout(process_id):
    port = _free_port()
    code = (
        "from jaxrl import distributed\n"
        f"distributed.initialize('127.0.0.1:{port}', 2, {process_id}, timeout_s=3)\n"
        "print('initialised')\n"
    )
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], env=_env(1), capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert p.returncode == 3, p.stderr[-2000:]
    assert "initialised" not in p.stdout
    assert f"waiting up to 3 s for 2 processes at 127.0.0.1:{port}" in p.stderr
    assert (
        f"jaxrl: peer processes did not connect to 127.0.0.1:{port} within 3 s (expected 2 processes)"
        in p.stderr
    )
    assert elapsed < 20
