"""Sharded safetensors read/write, shape checks, error messages and atomic output directories."""

import json

import ml_dtypes
import numpy as np
import pytest

from jaxrl.io._safetensors_dir import TensorReader, atomic_output_dir, parse_size, write_tensors
from jaxrl.errors import CheckpointError


def _tensors():
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((4, 8)).astype(np.float32),  # 128 bytes
        "b.weight": rng.standard_normal((8, 8)).astype(np.float32),  # 256 bytes
        "c.bias": rng.standard_normal((8,)).astype(ml_dtypes.bfloat16),  # 16 bytes
    }


def test_single_file_round_trip(tmp_path):
    tensors = _tensors()
    assert write_tensors(tmp_path, tensors, max_shard_size=10**6) == ["model.safetensors"]
    with TensorReader(tmp_path) as r:
        assert r.names() == set(tensors)
        for name, value in tensors.items():
            got = r.get(name, expected_shape=value.shape)
            assert got.dtype == value.dtype
            np.testing.assert_array_equal(got, value)


def test_sharded_round_trip_and_index(tmp_path):
    tensors = _tensors()
    files = write_tensors(tmp_path, tensors, max_shard_size=200)
    # 128 fits in shard 1; 256 exceeds 200 on its own -> shard 2; 16 would make 272 > 200 -> shard 3.
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert files == shards + ["model.safetensors.index.json"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 128 + 256 + 16
    assert index["weight_map"]["b.weight"] == "model-00002-of-00003.safetensors"
    with TensorReader(tmp_path) as r:
        for name, value in tensors.items():
            np.testing.assert_array_equal(r.get(name), value)


def test_reader_errors_name_file_tensor_and_shapes(tmp_path):
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        TensorReader(tmp_path)
    write_tensors(tmp_path, _tensors(), max_shard_size=200)
    with TensorReader(tmp_path) as r:
        with pytest.raises(CheckpointError, match=r"'z.weight' is missing from .*model.safetensors.index"):
            r.get("z.weight")
        with pytest.raises(CheckpointError, match=r"'a.weight' in .*model-00001-of-00003.safetensors has "
                           r"shape "
                           r"\(4, 8\), expected \(8, 4\)"):
            r.get("a.weight", expected_shape=(8, 4))
    (tmp_path / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="lists shard model-00003-of-00003.safetensors, which is miss"):
        TensorReader(tmp_path)


def test_corrupt_file_is_a_checkpoint_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="cannot read safetensors file .*model.safetensors"):
        TensorReader(tmp_path)


def test_atomic_output_dir_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out) as d:
            (d / "half.bin").write_bytes(b"x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with atomic_output_dir(out) as d:
        (d / "ok.bin").write_bytes(b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "ok.bin").is_file()
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        with atomic_output_dir(out):
            pass
    with atomic_output_dir(out, overwrite=True) as d:
        (d / "new.bin").write_bytes(b"y")
    assert sorted(p.name for p in out.iterdir()) == ["new.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("text,expected", [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("1.5KB", 1500), (7, 7)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_rejects_garbage():
    with pytest.raises(CheckpointError, match="'lots' is not a size"):
        parse_size("lots")
