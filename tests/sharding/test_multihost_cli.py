"""The real `jaxrl train` CLI as local process groups (gloo on localhost), against one process.

A pod run is N processes with D devices each; on one machine that is N subprocesses started with
`XLA_FLAGS=--xla_force_host_platform_device_count=D` and `--coordinator/--num-processes/--process-id`.
The same mesh (fsdp over all devices) on 2 processes x 2 devices and on 1 process x 4 devices runs the same
global program, so the metrics must agree step by step (rtol 1e-5: only the cross-process reduction order may
differ). Also: kill -9 of every process after a checkpoint and a relaunch resumes to identical metrics; a
process killed mid-step stops its peer within the heartbeat with one line naming it; four hosts of one device
(data x fsdp = 2 x 2, the SFT warm start included) against one host of four;
`jaxrl sample` / `export-hf` on a two-process checkpoint; `jaxrl train-rm` as two processes against one; a
trained reward model and a pairwise judge as rewards on two processes against one; AFRL's expert rows
padded to the mesh; the sampler on devices of its own (`mesh.rollout_devices`) on 2 processes x 4 devices
against 1 x 8.

The model is the quickstart's at hidden 32 and one layer; rewards are chosen to vary on a random policy
(a digit anywhere, and a length penalty), so equal losses are not equal zeros.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tests._xla import xla_flags

from jaxrl.runtime.distributed import EXIT_PEER_LOST, HEARTBEAT_ENV, PeerWatch, peer_verdict

# tests/suite.py runs these alone: 2-process jax.distributed groups keep both cores busy, and a lost peer
# must be noticed within a heartbeat.
pytestmark = pytest.mark.serial

JAXRL = [sys.executable, "-m", "jaxrl.cli", "train"]
TIMEOUT_S = 400

BASE = [
    "model.overrides={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16,"
    " mlp_dim: 64}",
    "sft_warmup.steps=0", "train.steps=2", "train.eval_every=1",
    "data.prompts_per_step=4", "data.eval_size=8", "data.train_size=200",
    "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.gen_buckets=[8]",
    "rewards=[{name: digit, type: format, weight: 1.0, params: {pattern: '.*[0-9].*'}},"
    " {name: short, type: length, weight: 0.5, params: {target: 4}}]",
    "logging.progress_bar=false", "logging.tensorboard=false", "logging.sample_every=1",
    "logging.num_samples=2",
    "checkpoint.every=1", "mesh.data=1", "mesh.fsdp=-1",
]

# One comparison asserts several things: ppo (a critic, GAE, 2 mini-batches) also checks the KL term, in the
# reward per token (its reference and the critic are checkpointed, so the kill -9 test below resumes both),
# process 0's tracker, and continuous batching (8 decode slots for the 16 rows of a step, refilled); gdpo starts from an SFT warm start on 4 hosts
# and packs its updates into rows (`train.packing: rows`: prompts of about 17 tokens left-padded to 64, so the
# two rows of each batch shard's block fit one packed row, fewer positions than even the shared-prompt
# forward's) and
# runs async with partial rollouts (k = 1: step 2's rows begun by the step-0 policy continue under step 1's,
# re-prefilled from tokens gathered over the four hosts; `jaxrl.rl.partial`); dapo
# is asynchronous and unpads its updates (`train.packing: unpadded`, each block's real tokens end to end,
# attention on the padded rows: `jaxrl.models.unpadded`; with prompts not shared, which computes less than
# its groups' shared prompts would; 2 processes x 2 devices)
# (`train.async.max_staleness=1`: step 2 trains on a rollout the step-0 policy sampled, its resampling rounds
# included, collected before step 1's update; `jaxrl.rl.ahead`).
CASES = {
    "ppo": ["algorithm.name=ppo", "train.steps=3", "algorithm.kl.beta=0.05", "algorithm.kl.where=reward",
            "logging.trackers=[mlflow]", "algorithm.ppo.lam=0.95", "algorithm.mini_batches=2",
            "rollout.engine.kind=continuous", "rollout.engine.slots=8", "data.prompts_per_step=8"],
    "dapo": ["algorithm.name=dapo", "algorithm.params.max_tries=2", "train.async.max_staleness=1",
             "train.packing=unpadded", "train.share_prompts=never", "rollout.prompt_buckets=[64]"],
    "gdpo": ["algorithm.name=gdpo", "sft_warmup.steps=4", "sft_warmup.batch_size=8", "train.packing=rows",
             "rollout.prompt_buckets=[64]", "train.async.max_staleness=1", "train.async.partial_rollouts=true"],
    "clipo_lora": ["algorithm.name=clipo", "model.lora={rank: 4, alpha: 8}", "model.quantize=int8",
                   "algorithm.kl.beta=0.05", "optimizer.lr=5e-2"],
    "rollout_devices": ["algorithm.name=grpo", "mesh.rollout_devices=4", "train.async.max_staleness=1",
                        "algorithm.kl.beta=0.05", "algorithm.kl.where=reward", "algorithm.mismatch.mode=tis"],
}
# the gradient norm too: a loss can be 0 by symmetry (token-mean advantages of equal-length rows) while the
# gradient is not
COMPARED = ("loss", "reward/mean", "eval/accuracy", "train/grad_norm", "async/staleness_max", "train/packed_rows",
            "async/token_staleness_mean")
# clipo_lora starts from the dapo case's 1 x 4 checkpoint (`model.checkpoint`: restored on every process and
# placed on either mesh), quantises it to int8 under LoRA adapters (the KL reference: the adapters off), and
# distils (loss mode) from the ppo case's checkpoint: the teacher is loaded the same way, its log-probs are a
# batch stage and a loss term. (CLIPO and LoRA were two cases, one CLI pair each, until 2026-11-28: one pair
# asserts both, each of which alone could make the two meshes differ.)
TEACHER_OF = {"clipo_lora": "ppo"}
INIT_OF = {"clipo_lora": "dapo"}
# The processes of a case's multi-process side (2 x 2 devices unless named here) and its mesh (both sides).
# gdpo runs as four hosts of one device each with data x fsdp = 2 x 2, so the data axis spans hosts and every
# host holds a quarter of the batch; one host of four devices must give the same metrics. (A separate 4 x 2
# run that only checked finite losses was this file's four-host case until 2026-11-29.)
HOSTS = {"gdpo": 4}
MESH_OF = {"gdpo": ["mesh.data=2", "mesh.fsdp=2"]}
# The devices of a case's runs, all processes together (4 unless named here). rollout_devices: 8, 4 of them
# sampling (`jaxrl.rl.placement`), so 2 processes give 2 of their 4 devices each to the sampler and 2 to the
# trainer (rows and parameter shards move between the meshes within each host), against 1 x 8 (the sampler on
# devices 0-3); k = 1, collected in place on 2 processes and in the background on 1: the same numbers. The KL
# in the reward and TIS's recomputed old log-probs: the trainer computes from the sampling parameters too.
DEVICES = {"rollout_devices": 8}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra: str) -> dict:
    env = dict(os.environ)
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPU_WORKER_HOSTNAMES"):
        env.pop(k, None)
    env.update(XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def _argv(run_dir: Path, overrides: list[str], config: str | None = None) -> list[str]:
    base = BASE if config is None else []
    return (JAXRL + ([config] if config else []) + ["--run-dir", str(run_dir)]
            + [a for o in base + overrides for a in ("--set", o)])


def launch(run_dir: Path, overrides: list[str], *, processes: int, devices: int, port: int | None = None,
           config: str | None = None, **env: str) -> list[subprocess.Popen]:
    """Start `processes` CLI processes with `devices` fake CPU devices each; stdout+stderr go to files.
    `config`: a config file instead of the quickstart defaults + BASE."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = _argv(run_dir, overrides, config)
    if processes > 1:
        port = port or _free_port()
        argv += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes)]
    procs = []
    for pid in range(processes):
        log = open(run_dir / f"log.{pid}.{time.monotonic_ns()}", "w")
        cmd = argv + (["--process-id", str(pid)] if processes > 1 else [])
        p = subprocess.Popen(cmd, env=_env(devices, **env), stdout=log, stderr=subprocess.STDOUT)
        p.log_path = Path(log.name)  # type: ignore[attr-defined]
        procs.append(p)
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[str]:
    """Wait for every process; kill all on timeout. Returns the logs; asserts every exit code is 0."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [p.log_path.read_text() for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"exit {p.returncode}:\n{log[-4000:]}"
    return logs


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), f"each step written once, by process 0 only: {steps}"
    return rows


def assert_same_metrics(got: list[dict], want: list[dict], keys=COMPARED) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    compared = 0
    for g, w in zip(got, want):
        for k in keys:
            if k in w:
                assert k in g, f"step {w['step']}: {k} missing"
                np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-7, err_msg=f"step {w['step']} {k}")
                compared += 1
    assert compared >= len(want)


_runs: dict[tuple[str, int], list[dict]] = {}


def run_case(name: str, processes: int, tmp_root: Path) -> list[dict]:
    """Metrics of CASES[name] on `processes` x (D / processes) devices, D = DEVICES[name] or 4 (cached for the
    module). The first call of a case starts its 1 x D and HOSTS[name] x (D / HOSTS[name]) runs together:
    alone, a run keeps about 1.6 of the 2 cores busy (start-up, compiles and gloo waits are partly serial), so
    the pair finishes sooner side by side."""
    if (name, processes) not in _runs:
        overrides = list(CASES[name]) + MESH_OF.get(name, [])
        if name in TEACHER_OF:
            run_case(TEACHER_OF[name], 1, tmp_root)
            overrides += [f"algorithm.distill.teacher={tmp_root / f'{TEACHER_OF[name]}-1'}",
                          "algorithm.distill.mode=reverse_kl_loss"]
        if name in INIT_OF:
            run_case(INIT_OF[name], 1, tmp_root)
            overrides += ["model.preset=null", f"model.checkpoint={tmp_root / f'{INIT_OF[name]}-1'}",
                          "model.overrides={}"]
        dirs = {n: tmp_root / f"{name}-{n}" for n in (1, HOSTS.get(name, 2)) if (name, n) not in _runs}
        procs = {n: launch(d, overrides, processes=n, devices=DEVICES.get(name, 4) // n) for n, d in dirs.items()}
        for n, group in procs.items():
            wait_all(group)
            _runs[name, n] = metrics(dirs[n])
    return _runs[name, processes]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multihost")


def test_peer_verdict_names_the_lost_process():
    seen = {1: ("", 0.0), 2: ("", 0.0)}
    assert peer_verdict({1: "beat:1", 2: "beat:1"}, seen, 1.0, 0, timeout_s=5) is None
    assert peer_verdict({1: "beat:2", 2: "beat:1"}, seen, 5.5, 0, timeout_s=5) is None  # 2 moved at t=1
    line = peer_verdict({1: "beat:3", 2: "beat:1"}, seen, 6.5, 0, timeout_s=5)
    assert line.startswith("jaxrl: lost process 2: no heartbeat for 5 s") and "\n" not in line
    assert peer_verdict({1: "done", 2: "beat:2"}, seen, 60.0, 0, timeout_s=5) is None  # done is not lost
    line = peer_verdict({1: "failed:ValueError on process 1: boom", 2: "beat:3"}, seen, 61.0, 0, timeout_s=5)
    assert line == "jaxrl: process 1 failed (ValueError on process 1: boom); stopping process 0 too"


def test_peer_watch_finish_waits_for_the_beat_in_flight():
    """A beat still being written when the process finishes must not overwrite its "done" (the peers would
    then wait for beats that never come), nor outlive `finish` (a thread inside the coordinator's C++ client
    at interpreter exit aborts the process): `finish` joins the thread before it writes its state."""
    store, in_beat, release = {}, threading.Event(), threading.Event()

    def kv_set(key, value):
        if value == "beat:2":  # the watch's second beat stalls, as a slow round trip to the coordinator
            in_beat.set()
            assert release.wait(10)
        store[key] = value

    watch = PeerWatch(0, 2, timeout_s=0.25, coordinator="test", kv_set=kv_set,
                      kv_dir=lambda prefix: [(k, v) for k, v in store.items() if k.startswith(prefix)]).start()
    assert in_beat.wait(10)
    finisher = threading.Thread(target=watch.finish, args=("done",))
    finisher.start()
    time.sleep(0.2)
    assert finisher.is_alive()  # waiting for the beat in flight
    release.set()
    finisher.join(10)
    assert not finisher.is_alive() and not watch._thread.is_alive()
    assert list(store.values()) == ["done"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_several_hosts_match_one_host(name, tmp_root):
    one = run_case(name, 1, tmp_root)
    two = run_case(name, HOSTS.get(name, 2), tmp_root)
    assert_same_metrics(two, one, keys=COMPARED + ("kl", "distill/reverse_kl", "distill/loss", "critic/vf_loss",
                                                   "critic/values_mean"))  # where present
    losses = [r["loss"] for r in one if "loss" in r]
    assert any(abs(x) > 1e-6 for x in losses), f"degenerate comparison: losses {losses}"
    if name == "dapo":
        assert any(r.get("dapo/resample_rounds", 0) > 0 for r in one), "DAPO never resampled"
    if name == "gdpo":  # partial rollouts: rows continued under the newer policy, at the same tokens' staleness
        assert all(r["async/continued_frac"] > 0 for r in one if "loss" in r), one
        assert [r["async/token_staleness_max"] for r in one if "loss" in r] == [0.0, 1.0], one
    if name in ("gdpo", "dapo"):  # packed (gdpo, 2 rows per packed row) or unpadded (dapo) updates, every step
        assert all(r["train/packed"] == 1 and r["train/unpadded"] == (name == "dapo") for r in one if "loss" in r), [
            (r.get("train/packed_rows"), r.get("train/unpadded")) for r in one]
    if name == "rollout_devices":  # k = 1 from the sampler's own devices, its weights moved there each step
        assert [r["async/staleness_max"] for r in two if "loss" in r] == [0.0, 1.0], two
        assert all(r["time/weight_sync"] > 0 for r in two if "loss" in r), two
    if name in TEACHER_OF:  # the teacher's log-probs reached the loss on both meshes
        assert all(r["distill/loss"] > 0 and r["distill/reverse_kl"] != 0 for r in one if "loss" in r), one
    if name == "ppo":  # the KL term is on and compared: the policy moved away from its reference
        assert any(r.get("kl", 0) > 0 for r in one), f"KL never positive: {[r.get('kl') for r in one]}"
        assert all(r["critic/vf_loss"] > 0 for r in one if "loss" in r), one  # the critic's loss, compared
        assert [r["rollout/decode_steps"] for r in two if "loss" in r] == [
            r["rollout/decode_steps"] for r in one if "loss" in r]  # 8 slots, refilled: more steps than 8
        assert all(r["rollout/decode_steps"] > 8 for r in one if "loss" in r), one


@pytest.mark.slow
def test_only_process_zero_logs_to_the_tracker(tmp_root, monkeypatch):
    """Trackers on several hosts (issue 31 item 1): the 2 x 2 run of CASES["ppo"] (`logging.trackers=[mlflow]`)
    has one MLflow run, the one RUN/trackers.json names, holding every step's loss of metrics.jsonl."""
    pytest.importorskip("mlflow")
    from jaxrl.runtime.trackers import STATE_FILE, mlflow_key

    two = run_case("ppo", 2, tmp_root)
    ids = json.loads((tmp_root / "ppo-2" / STATE_FILE).read_text())["mlflow"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to open a file store
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=ids["tracking_uri"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert [r.info.run_id for r in client.search_runs(experiments)] == [ids["run_id"]]
    history = client.get_metric_history(ids["run_id"], mlflow_key("loss", file_store=True))
    want = [(r["step"], float(r["loss"])) for r in two if "loss" in r]
    assert len(want) == 3 and sorted((m.step, m.value) for m in history) == want


@pytest.fixture(scope="module")
def rm_runs(tmp_root) -> dict[int, tuple[Path, list[dict]]]:
    """`jaxrl train-rm` on 1 x 4 and on 2 x 2 devices, side by side: {processes: (run dir, metrics rows)}.
    DIR with `debias.warmup_steps=1`: step 1 is the plain Bradley-Terry step (gamma = 0), steps 2-4 add the
    debiasing term, so one pair of runs compares both objectives."""
    dirs = {n: tmp_root / f"rm-{n}" for n in (1, 2)}
    procs = {n: _launch_rm(d, n, 4 // n, ["debias.enabled=true", "debias.warmup_steps=1"])
             for n, d in dirs.items()}
    out = {}
    for n, group in procs.items():
        wait_all(group)
        out[n] = (dirs[n], _rm_metrics(dirs[n]))
    return out


@pytest.fixture(scope="module")
def reward_model_dir(rm_runs) -> Path:
    """The one-process reward model of `rm_runs` (4 steps): its scores vary with the text."""
    return rm_runs[1][0]


@pytest.mark.slow
def test_model_and_pairwise_rewards_two_hosts_match_one_host(reward_model_dir, tmp_root):
    """A trained reward model (`type: model`) and a pairwise judge (`type: pairwise`) as rewards: each host
    scores the rows it owns (whole groups: the judge compares completions of one prompt only), and the run on
    2 processes x 2 devices follows the one on 1 x 4 step by step."""
    rewards = ("rewards=[{name: rm, type: model, weight: 1.0, params: {checkpoint: '%s', batch_size: 4}},"
               " {name: judge, type: pairwise, weight: 0.5, params: {judge: 'mh_judge:by_digits',"
               " group_size: 2}}]" % reward_model_dir)
    overrides = ["algorithm.name=grpo", rewards]
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    dirs = {n: tmp_root / f"model-rewards-{n}" for n in (1, 2)}  # side by side (`run_case`)
    procs = {n: launch(d, overrides, processes=n, devices=4 // n, **env) for n, d in dirs.items()}
    runs = {}
    for n, group in procs.items():
        wait_all(group)
        runs[n] = metrics(dirs[n])
    keys = COMPARED + ("reward/rm/mean", "reward/judge/mean")
    assert_same_metrics(runs[2], runs[1], keys=keys)
    rm = [r["reward/rm/mean"] for r in runs[1] if "reward/rm/mean" in r]
    assert len(rm) == 2 and all(np.isfinite(rm)) and len(set(rm)) == 2, f"RM rewards do not vary: {rm}"
    for run in runs.values():  # every host loaded the RM and ran the judge: no sample fell back to on_error
        assert all(r.get("reward/rm/errors", 0) == 0 and r.get("reward/judge/errors", 0) == 0 for r in run)
    judge = [r["reward/judge/mean"] for r in runs[1] if "reward/judge/mean" in r]
    assert judge and all(abs(x) < 1e-6 for x in judge), "a win rate averages to 0 over each group"
    assert any(abs(r["loss"]) > 1e-6 for r in runs[1] if "loss" in r)


@pytest.mark.slow
def test_sft_aux_expert_rows_fit_any_mesh(tmp_root):
    """AFRL's expert rows (one per prompt) next to the P·G rollout rows: 2 x 2 + 2 = 6 rows do not split over
    4 devices, so the trainer pads them with rows that train on nothing. The run on 2 processes x 2 devices
    follows the unpadded one-device run step by step: the padding (and the second host) changes no loss and no
    normaliser."""
    overrides = ["algorithm.name=sft_aux", "algorithm.params.lam=0.5", "data.prompts_per_step=2"]
    dirs = {(p, d): tmp_root / f"sft-aux-{p}x{d}" for p, d in ((1, 1), (2, 2))}  # side by side
    procs = {key: launch(d, overrides, processes=key[0], devices=key[1]) for key, d in dirs.items()}
    runs = {}
    for key, group in procs.items():
        wait_all(group)
        runs[key] = metrics(dirs[key])
    keys = COMPARED + ("sft/nll",)
    assert_same_metrics(runs[2, 2], runs[1, 1], keys=keys)
    assert all(r["sft/nll"] > 0 for r in runs[1, 1] if "loss" in r)


SMALL = ["model.overrides={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16,"
         " mlp_dim: 64, max_position_embeddings: 640}",
         "sft_warmup.steps=2", "sft_warmup.batch_size=4", "train.steps=2", "train.eval_every=2",
         "data.prompts_per_step=2", "data.eval_size=4", "rollout.group_size=2", "logging.progress_bar=false",
         "logging.tensorboard=false", "checkpoint.every=1", "mesh.data=1", "mesh.fsdp=-1"]
# Rollouts built on the hosts from environments and roles. MARCH runs with one LoRA adapter set per role: its
# collect stage is the one-policy run's with each role's adapters swapped in, and one policy sampling several
# roles is SSP's case. (A one-policy MARCH pair was a case of its own until 2026-11-28, 114 s of this file.)
# search decodes on the continuous engine: 4 slots for the 6 episodes of a step (2 prompts x 3), the batch split
# over fsdp = 2 (one shard per host of 2 x 2; tensor = 2 within a host), so each host admits its 3 episodes into
# its 2 slots and reuses one; the logged environment keeps every episode going for a second turn at least
# (`min_turns`), so slots wait for their environment and are fed observations. ssp keeps the static turn
# decoder (multi-turn search episodes, several hosts).
HOST_DRIVEN = {
    "search": ("configs/search_tiny.yaml", ["rollout.max_new_tokens=8", "rollout.gen_buckets=[8]",
                                            "rollout.engine.kind=continuous", "rollout.engine.slots=4",
                                            "rollout.group_size=3", "mesh.tensor=2", "mesh.rules=fsdp_tp"]),
    "ssp": ("configs/ssp_tiny.yaml", ["rollout.max_new_tokens=16", "rollout.gen_buckets=[16]"]),
    "march_role_adapters": ("configs/march_tiny.yaml", [  # one LoRA adapter set per role
        "rollout.max_new_tokens=16", "rollout.gen_buckets=[16]", "model.lora={rank: 4, alpha: 8}",
        "multi_agent.adapters=per_role", "optimizer.lr=5e-2"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HOST_DRIVEN))
def test_multi_turn_and_multi_agent_two_hosts_match_one_host(name, tmp_root):
    """Multi-turn episodes with a search tool, MARCH's roles (one LoRA adapter set per role) and SSP's (search
    episodes, a sequential update, the problem pool), from their shipped configs (model and steps shrunk):
    2 x 2 follows 1 x 4 step by step.
    Multi-turn episodes (`env:`): each host runs the environments of its own rows only (warm-start
    demonstrations, rollouts, evaluation), so two hosts start exactly as many episodes and answer exactly as
    many actions as one host does, and each of them some."""
    config, extra = HOST_DRIVEN[name]
    config = str(Path(__file__).resolve().parents[2] / config)
    runs, logs, procs = {}, {}, {}
    for processes in (1, 2):  # side by side (`run_case`)
        run_dir = tmp_root / f"{name}-{processes}"
        logged = []
        if name == "search":  # the same SearchEnv, logging each episode and action to its process's file
            env_file = Path(__file__).resolve().parent / "mh_env.py"
            logged = [f"env.name={env_file}:LoggedSearchEnv", f"env.params.log_dir={run_dir}",
                      "env.params.min_turns=2"]
        procs[processes] = launch(run_dir, SMALL + extra + logged, processes=processes, devices=4 // processes,
                                  config=config)
    for processes, group in procs.items():
        run_dir = tmp_root / f"{name}-{processes}"
        wait_all(group)
        runs[processes] = metrics(run_dir)
        logs[processes] = [Path(f).read_text().splitlines() for f in sorted(run_dir.glob("env.*.log"))]
    # the policy's entropy over the sampled (trained) tokens: equal only if both runs sampled the same tokens
    assert_same_metrics(runs[2], runs[1], keys=COMPARED + ("entropy",))
    assert sum(r.get("entropy", 0) > 0 for r in runs[1]) == 2, runs[1]
    if name == "search":  # continuous engine, episodes of 2 turns and more (slots fed their observations)
        steps = [r for r in runs[2] if "loss" in r]
        assert all(r["rollout/slot_use"] > 0 and r["episode/turns"] >= 2 for r in steps), steps
        assert len(logs[1]) == 1 and len(logs[2]) == 2, "one log file per process"
        # every host first checks its environment once (`dry_run`: reset + one step on the first record) before
        # any heavy work; the episodes themselves follow
        for lines in logs[1] + logs[2]:
            assert lines[0] == logs[1][0][0] and lines[1].startswith("step "), lines[:2]
        one, two = [lines[2:] for lines in logs[1]], [lines[2:] for lines in logs[2]]
        count = lambda lines, kind: sum(line.startswith(kind) for line in lines)
        for kind in ("reset ", "step "):
            assert count(one[0], kind) > 0
            assert count(two[0], kind) + count(two[1], kind) == count(one[0], kind), kind
            assert count(two[0], kind) > 0 and count(two[1], kind) > 0, kind
        assert sorted(two[0] + two[1]) == sorted(one[0]), "the same episodes and actions, split over hosts"


def _wait_for(predicate, procs, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"exited early ({dead[0].returncode}):\n{dead[0].log_path.read_text()[-4000:]}"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def _metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sigkill_after_checkpoint_then_relaunch_resumes_exactly(tmp_root):
    want = run_case("ppo", 1, tmp_root)
    run_dir = tmp_root / "killed"
    procs = launch(run_dir, CASES["ppo"], processes=2, devices=2)
    ckpt = run_dir / "checkpoints"
    # step 1's checkpoint is complete once step 2's metrics line exists (saves finish before the next step's
    # rollout completes... not guaranteed with async saves: a partial step is quarantined on restore).
    _wait_for(lambda: 2 in _metric_steps(run_dir) and (ckpt / "1").is_dir(), procs)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)
    assert all(p.returncode == -signal.SIGKILL for p in procs)
    logs = wait_all(launch(run_dir, CASES["ppo"], processes=2, devices=2))
    assert any("resumed from step" in log for log in logs), logs[0][-3000:]
    assert_same_metrics(metrics(run_dir), want)


@pytest.mark.slow
def test_lost_process_stops_the_survivor_within_the_heartbeat(tmp_root):
    heartbeat = 6
    run_dir = tmp_root / "lost"
    procs = launch(run_dir, ["train.steps=200", "train.eval_every=0"], processes=2,  # BASE's GRPO: no critic
                   devices=2, **{HEARTBEAT_ENV: str(heartbeat)})
    _wait_for(lambda: 1 in _metric_steps(run_dir), procs)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    try:
        procs[0].wait(timeout=heartbeat + 20)
    finally:
        if procs[0].poll() is None:
            procs[0].kill()
    elapsed = time.monotonic() - killed
    log = procs[0].log_path.read_text()
    assert procs[0].returncode == EXIT_PEER_LOST, log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("jaxrl: lost process")]
    assert len(lines) == 1 and re.match(r"jaxrl: lost process 1: no heartbeat for 6 s", lines[0]), log[-3000:]
    assert elapsed < heartbeat + 8, elapsed


def test_sample_and_export_read_a_two_process_checkpoint(tmp_root, tmp_path):
    """A checkpoint written by two processes loads in one process: `export-hf` gives the weights of the
    one-process run (same global program, rtol 1e-5) and `jaxrl sample` generates from it."""
    from safetensors.numpy import load_file

    run_case("ppo", 1, tmp_root)
    run_case("ppo", 2, tmp_root)
    exports = {n: subprocess.Popen([sys.executable, "-m", "jaxrl.cli", "export-hf", "--checkpoint",
                                    str(tmp_root / f"ppo-{n}"), "--out", str(tmp_path / f"hf{n}")], env=_env(1),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for n in (1, 2)}  # side by side: one device each
    exported = {}
    for n, proc in exports.items():
        log = proc.communicate(timeout=TIMEOUT_S)[0]
        assert proc.returncode == 0, log[-3000:]
        exported[n] = {k: v for f in sorted((tmp_path / f"hf{n}").glob("*.safetensors"))
                       for k, v in load_file(f).items()}
    assert exported[1] and exported[1].keys() == exported[2].keys()
    for k in exported[1]:
        np.testing.assert_allclose(exported[2][k], exported[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
    proc = subprocess.run([sys.executable, "-m", "jaxrl.cli", "sample", "--checkpoint", str(tmp_root / "ppo-2"),
                           "--prompt", "What is 2 + 3?", "--max-new-tokens", "4", "--temperature", "0"],
                          env=_env(1), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]


RM_ARGS = ["train.steps=4", "train.eval_every=2", "logging.every=1", "checkpoint.every=2", "data.train_size=256",
           "data.eval_size=64", "data.batch_size=8"]


def _launch_rm(run_dir: Path, processes: int, devices: int, extra: list[str]) -> list[subprocess.Popen]:
    argv = [sys.executable, "-m", "jaxrl.cli", "train-rm", "--run-dir", str(run_dir)]
    argv += [a for o in RM_ARGS + extra for a in ("--set", o)]
    if processes > 1:
        argv += ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", str(processes)]
    procs = []
    for pid in range(processes):
        run_dir.mkdir(parents=True, exist_ok=True)
        log = open(run_dir.parent / f"{run_dir.name}.log.{pid}", "w")
        p = subprocess.Popen(argv + (["--process-id", str(pid)] if processes > 1 else []), env=_env(devices),
                             stdout=log, stderr=subprocess.STDOUT)
        p.log_path = Path(log.name)  # type: ignore[attr-defined]
        procs.append(p)
    return procs


def _rm_metrics(run_dir: Path) -> list[dict]:
    merged: dict[int, dict] = {}  # the final eval row shares the last step's number
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(row)
    return [merged[k] for k in sorted(merged)]


@pytest.mark.slow
def test_train_rm_two_hosts_match_one_host(rm_runs):
    """`jaxrl train-rm` as two processes (data-parallel over 2 x 2 devices) follows the one-process run step by
    step (BT at step 1, DIR after it), and only process 0 writes the run's files."""
    (one_dir, one), (two_dir, two) = rm_runs[1], rm_runs[2]
    assert_same_metrics(two, one, keys=("rm/loss", "rm/acc", "eval/accuracy", "dir/club_mi"))
    assert sum(1 for r in one if "eval/accuracy" in r) == 2
    assert json.loads((two_dir / "eval_rm.json").read_text())["accuracy"] == pytest.approx(
        json.loads((one_dir / "eval_rm.json").read_text())["accuracy"], rel=1e-5)
    steps = sorted(p.name for p in (two_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == ["4"]  # checkpoint.keep=1 of the embedded config


def test_host_rows_on_one_process_are_the_identity():
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxrl.sharding import MeshConfig, make_mesh
    from jaxrl.sharding.hosts import fetch_held, gather_owned, held_rows, host_to_global, row_owners

    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    values = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    for spec in (P(("data", "fsdp")), P("data"), P()):  # split, partly replicated, replicated
        sharding = NamedSharding(mesh, spec)
        x = host_to_global(values, sharding)
        assert x.sharding == sharding and jax.process_count() == 1
        np.testing.assert_array_equal(fetch_held(x), values)
        assert row_owners(sharding, values.shape).tolist() == [0] * 16
        assert held_rows(sharding, values.shape).all()
        np.testing.assert_array_equal(gather_owned(values, row_owners(sharding, values.shape)), values)
