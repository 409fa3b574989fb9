"""Sampler and trainer on disjoint devices, `mesh.rollout_devices` (issue 27 item 2; jaxrl.rl.placement).

Through the real CLI: 8 fake devices with 4 set apart for the sampler train exactly as 4 devices shared by both
(the same training mesh shape; sampling does not depend on where rows sit), asynchronously (k = 1), where the
collection then overlaps the update. In process: the placement helpers and the configuration errors.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl.cli import main
from jaxrl.errors import ConfigError
from jaxrl.rl import placement
from jaxrl.sharding import MeshConfig, make_mesh
from tests.sharding.test_multihost_cli import BASE, _env, assert_same_metrics, metrics

# the trainer also computes from the sampling parameters: the KL penalty in the reward (a shaping stage) and the
# old log-probs recomputed for TIS, on the training mesh
ASYNC = ["train.async.max_staleness=1", "train.steps=3", "algorithm.name=grpo", "algorithm.kl.beta=0.05",
         "algorithm.kl.where=reward", "algorithm.mismatch.mode=tis"]
COMPARED = ("loss", "reward/mean", "eval/accuracy", "train/grad_norm", "async/staleness_max", "entropy", "kl")


@pytest.mark.slow  # two tiny CLI runs side by side, about 40 s
def test_eight_devices_with_four_sampling_train_as_four_shared(tmp_path):
    runs = {}
    for devices, extra in ((8, ["mesh.rollout_devices=4"]), (4, [])):
        run_dir = tmp_path / f"d{devices}"
        argv = [sys.executable, "-m", "jaxrl.cli", "train", "--run-dir", str(run_dir)]
        argv += [a for o in BASE + ASYNC + extra for a in ("--set", o)]
        runs[devices] = (run_dir, subprocess.Popen(argv, env=_env(devices), stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True))
    logs = {d: p.communicate(timeout=600)[0] for d, (_, p) in runs.items()}
    for d, (_, p) in runs.items():
        assert p.returncode == 0, logs[d][-3000:]
    assert "the sampler on devices [0, 1, 2, 3], the trainer on devices [4, 5, 6, 7]" in logs[8], logs[8][-2000:]
    got, want = metrics(runs[8][0]), metrics(runs[4][0])
    assert_same_metrics(got, want, keys=COMPARED)
    assert [r.get("async/staleness_max") for r in got if "loss" in r] == [0.0, 1.0, 1.0]
    assert all(r["time/weight_sync"] > 0 for r in got if "loss" in r)  # timed, the placement included


def test_split_devices_and_the_sampler_mesh():
    devices = jax.devices()
    assert len(devices) == 8
    sampler, trainer = placement.split_devices(devices, 3)
    assert sampler == devices[:3] and trainer == devices[3:]
    mesh = placement.rollout_mesh(MeshConfig(tensor=2, rules="fsdp_tp"), devices[:4])
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    with pytest.raises(ConfigError, match="must be a multiple of mesh.tensor=2"):
        placement.rollout_mesh(MeshConfig(tensor=2, rules="fsdp_tp"), devices[:3])
    for n in (0, 8, 9):
        with pytest.raises(ConfigError, match=re.escape(f"mesh.rollout_devices={n}: must leave devices to both")):
            placement.split_devices(devices, n)
    hosts = [SimpleNamespace(id=i, process_index=i // 4) for i in range(8)]  # 2 processes x 4 devices
    sampler, trainer = placement.split_devices(hosts, 4)  # 2 of each host's, host by host
    assert [d.id for d in sampler] == [0, 1, 4, 5] and [d.id for d in trainer] == [2, 3, 6, 7]
    for n in (0, 3, 8):
        with pytest.raises(ConfigError, match=re.escape(f"mesh.rollout_devices={n}: must be a multiple of the 2 "
                                                        "processes that leaves devices to both sides on each, "
                                                        "between 2 and 6")):
            placement.split_devices(hosts, n)


def test_shards_move_between_meshes_from_their_own_process():
    """The path of several processes (`placement._move_local`), here on one: each target block cut from a
    source block that holds it (a sub-block where the target splits finer), or assembled from the source
    blocks that tile it (coarser)."""
    devices = jax.devices()
    two = make_mesh(MeshConfig(), devices[6:])  # fsdp 2
    four = make_mesh(MeshConfig(), devices[:4])  # fsdp 4
    values = np.arange(32.0).reshape(8, 4)
    split, whole, cols = PartitionSpec("fsdp"), PartitionSpec(), PartitionSpec(None, "fsdp")
    for (src_mesh, src), (dst_mesh, dst) in (((two, split), (four, split)), ((two, whole), (four, split)),
                                             ((two, whole), (four, whole)), ((four, split), (two, split)),
                                             ((four, split), (two, whole)), ((four, split), (two, cols))):
        x = jax.device_put(values, NamedSharding(src_mesh, src))
        target = NamedSharding(dst_mesh, dst)
        moved = placement._move_local(x, target, placement._local_plan(x.sharding, target, x.shape))
        assert moved.sharding == target
        for shard in moved.addressable_shards:
            np.testing.assert_array_equal(shard.data, np.asarray(x)[shard.index])


def test_put_on_moves_device_arrays_keeping_their_spec():
    devices = jax.devices()
    train = make_mesh(MeshConfig(), devices[6:])  # fsdp 2
    sample = make_mesh(MeshConfig(), devices[:4])  # fsdp 4
    x = jax.device_put(np.arange(24.0).reshape(8, 3), NamedSharding(train, PartitionSpec("fsdp")))
    odd = jax.device_put(np.arange(6.0), NamedSharding(train, PartitionSpec(("data", "fsdp"))))
    tree = {"x": x, "host": np.ones(3), "odd": odd}  # 6 rows split 2 ways, not 4: replicated there
    moved = placement.put_on(tree, sample)
    assert moved["x"].sharding.is_equivalent_to(NamedSharding(sample, PartitionSpec("fsdp")), 2)
    np.testing.assert_array_equal(moved["x"], x)
    assert moved["host"] is tree["host"]
    assert moved["odd"].sharding.is_equivalent_to(NamedSharding(sample, PartitionSpec()), 1)
    np.testing.assert_array_equal(moved["odd"], np.arange(6.0))
    assert placement.put_on(moved, sample)["x"] is moved["x"]  # already there: untouched


@pytest.mark.parametrize("sets, says", [
    (["mesh.rollout_devices=8"], "mesh.rollout_devices=8: must leave devices to both sides, between 1 and 7"),
    (["mesh.rollout_devices=-1"], "mesh.rollout_devices=-1: must be an integer >= 0"),
    (["mesh.rollout_devices=4", "model.lora={rank: 2, alpha: 4}", "multi_agent={system: march, params: "
      "{corpus_size: rooms, num_distractors: 0}, adapters: per_role}", "rollout.group_size=2",
      "data.source=entities", "data.params={corpus_size: rooms, max_hops: 1}"],
     "mesh.rollout_devices with multi_agent.adapters='per_role': not supported yet"),
])
def test_bad_rollout_devices_exit_2_with_one_line(tmp_path, capsys, sets, says):
    args = ["train", "--run-dir", str(tmp_path / "run")] + [a for s in BASE[:1] + sets for a in ("--set", s)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (Path(tmp_path / "run") / "checkpoints").exists()
