"""jaxrl launch: the exact gcloud commands for a v5p-64 config, and the preemption loop with a fake gcloud."""

import shlex
import subprocess
import time

import pytest

from jaxrl import cli
from jaxrl.errors import UserError
from jaxrl.runtime.launch import LaunchSpec, create_cmd, delete_cmd, launch_cmds, stop_cmd, supervise

SHA = "0123456789abcdef0123456789abcdef01234567"
WHERE = "--zone us-east5-a --project my-proj"


def _spec(**kw):
    base = dict(config="configs/grpo_qwen3_8b_v5p64.yaml", tpu="grpo-8b", zone="us-east5-a",
                accelerator_type="v5p-64", commit=SHA, project="my-proj", spot=True,
                run_dir="gs://bkt/runs/8b")
    return LaunchSpec(**{**base, **kw})


EXPECTED_V5P_64 = [
    f"git archive --format=tar.gz -o /tmp/jaxrl-0123456789ab.tar.gz {SHA}",
    "gcloud compute tpus tpu-vm create grpo-8b --accelerator-type v5p-64 --version v2-alpha-tpuv5 --spot "
    f"{WHERE}",
    "gcloud compute tpus tpu-vm scp /tmp/jaxrl-0123456789ab.tar.gz configs/grpo_qwen3_8b_v5p64.yaml "
    f"'grpo-8b:~/' --worker=all {WHERE}",
    "gcloud compute tpus tpu-vm ssh grpo-8b --worker=all " + shlex.quote(
        "--command=rm -rf ~/jaxrl && mkdir -p ~/jaxrl ~/jaxrl-run && "
        "tar -xzf ~/jaxrl-0123456789ab.tar.gz -C ~/jaxrl && "
        "cp ~/grpo_qwen3_8b_v5p64.yaml ~/jaxrl-run/config.yaml && "
        "python3 -m pip install -q --user uv==0.13.8 && "
        "~/.local/bin/uv venv -q --allow-existing --python 3.11 ~/jaxrl-venv && "
        "~/.local/bin/uv pip install -q --python ~/jaxrl-venv/bin/python -e ~/jaxrl 'jax[tpu]==0.10.2'"
    ) + f" {WHERE}",
    "gcloud compute tpus tpu-vm ssh grpo-8b --worker=all " + shlex.quote(
        "--command=cd ~/jaxrl-run && (p=$(cat train.pid 2>/dev/null) && [ -n \"$p\" ] && "
        "kill -TERM -\"$p\" 2>/dev/null && while kill -0 -\"$p\" 2>/dev/null; do sleep 1; done; true) && "
        "rm -f train.rc && "
        "{ setsid nohup sh -c 'trap : TERM INT; ~/jaxrl-venv/bin/python -m jaxrl.cli train "
        "~/jaxrl-run/config.yaml --run-dir "
        "gs://bkt/runs/8b; echo $? > ~/jaxrl-run/train.rc' > ~/jaxrl-run/train.log 2>&1 < /dev/null & "
        "echo $! > ~/jaxrl-run/train.pid; }"
    ) + f" {WHERE}",
    "gcloud compute tpus tpu-vm ssh grpo-8b --worker=0 " + shlex.quote(
        "--command=tail --pid=$(cat ~/jaxrl-run/train.pid) -n +1 -F ~/jaxrl-run/train.log; "
        "exit $(cat ~/jaxrl-run/train.rc 2>/dev/null || echo 254)"
    ) + f" {WHERE}",
]


def test_v5p_64_commands_exact():
    assert [shlex.join(c) for c in launch_cmds(_spec())] == EXPECTED_V5P_64


def test_queued_v5e_and_stop_delete():
    spec = _spec(queued=True, spot=False, accelerator_type="v5e-16", project=None)
    assert create_cmd(spec) == [
        "gcloud", "compute", "tpus", "queued-resources", "create", "grpo-8b", "--node-id", "grpo-8b",
        "--accelerator-type", "v5litepod-16", "--runtime-version", "v2-alpha-tpuv5-lite",
        "--zone", "us-east5-a",
    ]
    assert delete_cmd(spec) == [
        "gcloud", "compute", "tpus", "queued-resources", "delete", "grpo-8b", "--force", "--quiet",
        "--zone", "us-east5-a",
    ]
    assert stop_cmd(spec)[-3].startswith("--command=cd ~/jaxrl-run && (p=$(cat train.pid")


@pytest.mark.parametrize(
    "kw, message",
    [(dict(accelerator_type="v5p64"), r"--accelerator-type='v5p64': expected GENERATION-SIZE"),
     (dict(accelerator_type="tpu-8"), r"generation one of v4, v5p, v5litepod \(v5e\), v6e"),
     (dict(tpu="My_TPU"), r"--tpu='My_TPU': lowercase letters")],
)
def test_bad_launch_arguments(kw, message):
    with pytest.raises(UserError, match=message):
        _spec(**kw)


def test_dry_run_cli_prints_commands_and_runs_nothing(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mesh: {fsdp: -1}\n")
    calls = []
    real_run = subprocess.run

    def spy(argv, *a, **k):
        calls.append(argv)
        assert argv[0] == "git" and argv[1] in ("rev-parse", "status"), argv  # read-only git only
        return real_run(argv, *a, **k)

    monkeypatch.setattr(subprocess, "run", spy)
    argv = ["launch", str(cfg), "--tpu", "t1", "--zone", "z", "--accelerator-type", "v6e-8", "--dry-run"]
    rc = cli.main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(lines) == 6
    assert lines[1] == (
        "gcloud compute tpus tpu-vm create t1 --accelerator-type v6e-8 --version v2-alpha-tpuv6e --zone z"
    )
    assert not any(c[0] == "gcloud" for c in calls)


class FakeGcloud:
    """Replays TPU states; the first training stream ends in a preemption."""

    def __init__(self, states, stream_rcs):
        self.states, self.stream_rcs, self.calls = list(states), list(stream_rcs), []

    def __call__(self, argv):
        self.calls.append(argv)
        out, rc = "", 0
        if "describe" in argv:
            state = self.states.pop(0)
            out, rc = (state + "\n", 0) if state != "NOT_FOUND" else ("", 1)
        elif any(a.startswith("--command=tail --pid") for a in argv):
            rc = self.stream_rcs.pop(0)
        return subprocess.CompletedProcess(argv, rc, out, "")

    def verbs(self):
        names = {"create": "create", "delete": "delete", "scp": "copy"}
        out = []
        for c in self.calls:
            if c[0] == "git":
                out.append("package")
            elif c[4] in names:
                out.append(names[c[4]])
            elif c[4] == "ssh":
                cmd = c[-5]
                out.append("install" if "uv" in cmd else "start" if "nohup" in cmd else "stream")
        return out


def test_supervisor_recreates_after_preemption_and_resumes():
    # missing -> create -> CREATING -> READY; stream breaks (255) with the VM PREEMPTED; delete + create;
    # READY; second stream ends with training's exit code 0 on a READY VM.
    fake = FakeGcloud(
        states=["NOT_FOUND", "CREATING", "READY", "PREEMPTED", "PREEMPTED", "READY", "READY"],
        stream_rcs=[255, 0],
    )
    logs = []
    rc = supervise(_spec(), fake, sleep=lambda s: None, log=logs.append)
    assert rc == 0
    assert fake.verbs() == [
        "package", "create", "copy", "install", "start", "stream",
        "delete", "create", "copy", "install", "start", "stream",
    ]
    assert any("PREEMPTED: re-creating it and resuming (1/20)" in m for m in logs)


def test_supervisor_reconnects_stream_without_restarting_and_reports_failure():
    fake = FakeGcloud(states=["READY", "READY", "READY"], stream_rcs=[255, 7])
    rc = supervise(_spec(), fake, sleep=lambda s: None, log=lambda m: None)
    assert rc == 7  # training's own failure is returned, not retried
    assert fake.verbs() == ["package", "copy", "install", "start", "stream", "stream"]


def test_supervisor_gives_up_after_max_restarts():
    fake = FakeGcloud(states=["READY"] + ["PREEMPTED", "PREEMPTED", "READY"] * 3, stream_rcs=[255] * 3)
    assert supervise(_spec(), fake, sleep=lambda s: None, log=lambda m: None, max_restarts=2) == 1


def test_supervisor_restarts_training_stopped_by_sigterm_and_stops_on_zero():
    # exit 75 (SIGTERM, checkpoint saved) on a READY VM: start again (no re-install) and resume; 0 ends it.
    fake = FakeGcloud(states=["READY", "READY", "READY"], stream_rcs=[75, 0])
    logs = []
    assert supervise(_spec(), fake, sleep=lambda s: None, log=logs.append) == 0
    assert fake.verbs() == ["package", "copy", "install", "start", "stream", "start", "stream"]
    assert any("stopped by SIGTERM (exit 75" in m for m in logs)


def test_supervisor_does_not_restart_after_ctrl_c_exit_code():
    fake = FakeGcloud(states=["READY", "READY"], stream_rcs=[130])
    assert supervise(_spec(), fake, sleep=lambda s: None, log=lambda m: None) == 130
    assert fake.verbs() == ["package", "copy", "install", "start", "stream"]


def test_remote_run_dir_is_shell_quoted(tmp_path):
    """The start command, run by a real shell as ssh would, passes a hostile --run-dir through literally."""
    from jaxrl.runtime.launch import start_script

    home = tmp_path / "home"
    (home / "jaxrl-venv" / "bin").mkdir(parents=True)
    (home / "jaxrl-run").mkdir()
    fake_python = home / "jaxrl-venv" / "bin" / "python"
    fake_python.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$HOME/argv"\n')
    fake_python.chmod(0o755)
    hostile = "gs://b/$(touch $HOME/pwned-a)`touch $HOME/pwned-b`'; touch $HOME/pwned-c; echo '$(id)"
    script = start_script(_spec(run_dir=hostile))
    subprocess.run(["sh", "-c", script], env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, check=True,
                   timeout=30)
    rc_file = home / "jaxrl-run" / "train.rc"
    for _ in range(300):
        if rc_file.exists() and rc_file.read_text().strip():
            break
        time.sleep(0.02)
    assert rc_file.read_text().strip() == "0"
    argv = (home / "argv").read_text().splitlines()
    assert argv == ["-m", "jaxrl.cli", "train", f"{home}/jaxrl-run/config.yaml", "--run-dir", hostile]
    assert not list(home.glob("pwned-*"))


def test_stop_reaches_the_trainer_and_its_exit_code_is_recorded(tmp_path):
    """`stop` (and a relaunch) signals the trainer itself, not only the wrapper shell whose pid is train.pid;
    the wrapper survives to record the trainer's exit code (75: preempted, checkpoint saved)."""
    from jaxrl.runtime.launch import start_script

    home = tmp_path / "home"
    (home / "jaxrl-venv" / "bin").mkdir(parents=True)
    (home / "jaxrl-run").mkdir()
    fake_python = home / "jaxrl-venv" / "bin" / "python"
    fake_python.write_text('#!/bin/sh\ntrap \'echo term > "$HOME/got-term"; exit 75\' TERM\n'
                           'touch "$HOME/started"\nwhile :; do sleep 0.05; done\n')
    fake_python.chmod(0o755)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(["sh", "-c", start_script(_spec(run_dir="gs://b/r"))], env=env, check=True, timeout=30)
    for _ in range(600):
        if (home / "started").exists():
            break
        time.sleep(0.02)
    assert (home / "started").exists()
    stop = next(a for a in stop_cmd(_spec()) if a.startswith("--command=")).removeprefix("--command=")
    subprocess.run(["sh", "-c", stop], env=env, check=True, timeout=60)  # returns once the group is gone
    assert (home / "got-term").read_text().strip() == "term"
    assert (home / "jaxrl-run" / "train.rc").read_text().strip() == "75"
