"""Reading and writing the tensor files of a Hugging Face directory, one tensor at a time.

* Reading: `TensorReader(dir)` finds `model.safetensors` or the sharded `model.safetensors.index.json` and
  returns each tensor as a numpy array on request (`safe_open`, so only that tensor is in host memory). Every
  failure is a `CheckpointError` naming the file and the tensor; shapes are checked against the caller's.
* Writing: `write_tensors(dir, tensors, max_shard_size)` packs tensors into shards of at most `max_shard_size`
  bytes (a larger tensor gets a shard of its own, as in transformers) and writes the index when there
  is more than one shard.
* `atomic_output_dir(path)`: build a directory next to `path` and rename it into place only on success.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrl.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class TensorReader:
    """Lazy access to the tensors of an HF directory (single file or sharded with an index)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._weight_map = self._read_weight_map()
        self._handles: dict[str, object] = {}
        self._stack = contextlib.ExitStack()

    def _read_weight_map(self) -> dict[str, str]:
        index, single = self.directory / INDEX_FILE, self.directory / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a safetensors index (no 'weight_map'): {e}") from e
            for file in sorted(set(weight_map.values())):
                if not (self.directory / file).is_file():
                    raise CheckpointError(
                        f"{index} lists shard {file}, which is missing from {self.directory}")
            return dict(weight_map)
        if single.is_file():
            with self._open_raw(single) as f:
                return {name: SINGLE_FILE for name in f.keys()}
        raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {self.directory}")

    @staticmethod
    def _open_raw(path: Path):
        try:
            return safe_open(str(path), framework="np")
        except Exception as e:  # safetensors raises its own SafetensorError for corrupt headers
            raise CheckpointError(f"cannot read safetensors file {path}: {e}") from e

    def _handle(self, file: str):
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(self._open_raw(self.directory / file))
        return self._handles[file]

    def names(self) -> set[str]:
        return set(self._weight_map)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self._file(name)).get_slice(name).get_shape())

    def _file(self, name: str) -> str:
        if name not in self._weight_map:
            where = INDEX_FILE if (self.directory / INDEX_FILE).is_file() else SINGLE_FILE
            raise CheckpointError(f"tensor {name!r} is missing from {self.directory / where}")
        return self._weight_map[name]

    def get(self, name: str, expected_shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Read one tensor; with `expected_shape`, check the shape before reading the data."""
        file = self._file(name)
        if expected_shape is not None:
            found = self.shape(name)
            if found != tuple(expected_shape):
                raise CheckpointError(
                    f"tensor {name!r} in {self.directory / file} has shape {found}, "
                    f"expected {tuple(expected_shape)}"
                )
        return self._handle(file).get_tensor(name)

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_all(file: str | os.PathLike, what: str = "safetensors file") -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file (small files: adapters); a missing or corrupt file is a
    `CheckpointError` "cannot read `what` FILE: ..."."""
    try:
        with safe_open(str(file), framework="np") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors raises its own error type for missing or corrupt files
        raise CheckpointError(f"cannot read {what} {file}: {e}") from e


def _shard_groups(tensors: Iterable[tuple[str, np.ndarray]], max_shard_size: int) -> Iterator[dict]:
    shard: dict[str, np.ndarray] = {}
    size = 0
    for name, array in tensors:
        if shard and size + array.nbytes > max_shard_size:
            yield shard
            shard, size = {}, 0
        shard[name] = np.ascontiguousarray(array)
        size += array.nbytes
    if shard:
        yield shard


def write_tensors(directory: Path, tensors: Iterable[tuple[str, np.ndarray]] | dict[str, np.ndarray],
                  max_shard_size: int) -> list[str]:
    """Write tensors as safetensors shards (+ index if more than one) into `directory`; returns file names.

    `tensors` may be a generator of `(name, array)`: only one shard is held in memory at a time (shards get
    temporary names and are renamed to `model-0000i-of-0000n.safetensors` once their count is known).
    """
    if max_shard_size <= 0:
        raise CheckpointError(f"max_shard_size must be a positive number of bytes, got {max_shard_size}")
    items = tensors.items() if isinstance(tensors, dict) else tensors
    metadata = {"format": "pt"}  # transformers refuses safetensors files without a known format tag
    parts, weight_map, total = [], {}, 0
    for i, group in enumerate(_shard_groups(items, max_shard_size)):
        part = f".part-{i:05d}.safetensors"
        save_file(group, str(directory / part), metadata=metadata)
        parts.append(part)
        for name, array in group.items():
            weight_map[name] = i
            total += array.nbytes
        del group
    if len(parts) == 1:
        os.rename(directory / parts[0], directory / SINGLE_FILE)
        return [SINGLE_FILE]
    files = [f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors" for i in range(len(parts))]
    for part, file in zip(parts, files):
        os.rename(directory / part, directory / file)
    index = {"metadata": {"total_size": total},
             "weight_map": {name: files[i] for name, i in sorted(weight_map.items())}}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return files + [INDEX_FILE]


def parse_size(size: int | str) -> int:
    """'5GB' / '500MB' / '10KB' / 1234 -> bytes (decimal units, as transformers uses)."""
    if isinstance(size, int):
        return size
    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    text = size.strip().upper()
    for unit, factor in units.items():
        if text.endswith(unit) and text[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return int(float(text[: -len(unit)]) * factor)
    raise CheckpointError(f"max_shard_size {size!r} is not a size; use bytes or e.g. '5GB', '500MB'")


@contextlib.contextmanager
def atomic_output_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory next to `path`; on success it is renamed to `path`.

    On any exception the temporary directory is removed and `path` is untouched. Without `overwrite`, an
    existing non-empty `path` is an error (raised before any work is done).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"output path {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise CheckpointError(f"output directory {path} already exists and is not empty")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
