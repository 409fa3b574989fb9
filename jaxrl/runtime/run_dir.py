"""Run and output directories: what may be written where, checked before any model is built or any
file is written.

* `check_writable_dir`, `check_output_dir`: the directory checks of `jaxrl train` (`jaxrl.runtime.run_checks`) and of
  the exporters.
* `earlier_run`, `start_fresh_run`: a fresh run (`checkpoint.resume: false`, `jaxrl train --overwrite-run`)
  never writes into a directory that holds another run's checkpoints or metrics; `--overwrite-run` moves that
  run aside to a sibling `RUN.old-<timestamp>` (never deletes it), under the run's lock.
* `replace_owned_files(path, owns=..., overwrite=...)` (used by `export-hf` / `import-hf`): writes into a
  fresh sibling directory, then moves the new files into `path`. With `--overwrite` only files the exporter
  writes are replaced; a run or checkpoint directory, or any file the exporter did not write, is refused (the
  old helper renamed the whole directory away and deleted a training run given as `--out`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from jaxrl.errors import OutputDirError, RunDirError

# TransformerConfig fields that change how the forward pass runs but not the parameters; they may change on
# resume. Token ids are compared through the tokenizer.
EXECUTION_ONLY = ("dtype", "remat", "scan_layers", "attention", "bos_token_id", "eos_token_id", "pad_token_id")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "vocab.txt", "merges.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "additional_chat_templates",
                   "preprocessor_config.json")
HF_EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors",
                   "model.safetensors.index.json", "configuration_jaxrl.py", "modeling_jaxrl.py",
                   *TOKENIZER_FILES)
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
MODEL_CHECKPOINT_FILES = ("model_config.json", "params", "tokenizer")


def owns_hf_export(name: str) -> bool:
    """Whether `export-hf` writes a file of this name (config, generation config, shards, tokenizer, code)."""
    return name in HF_EXPORT_FILES or bool(_SHARD.fullmatch(name))


def owns_model_checkpoint(name: str) -> bool:
    """Whether `import-hf` writes a file of this name (`model_config.json`, `params/`, `tokenizer/`)."""
    return name in MODEL_CHECKPOINT_FILES


def _is_run_dir(path: Path) -> str | None:
    """Why `path` is a training run or trainer checkpoint directory, or None."""
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        return "a training run directory"
    steps = [p.name for p in path.iterdir() if p.is_dir() and p.name.isdigit()]
    if steps and (path / "model_config.json").is_file():
        return f"a trainer checkpoint directory (steps {', '.join(sorted(steps, key=int)[:3])})"
    return None


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """`path` is (or can be created as) a directory this process can write: RunDirError otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{what} {path} exists and is not a directory")
    probe = path
    while not probe.exists():  # the nearest existing ancestor must be a writable directory
        probe = probe.parent
    if not probe.is_dir():
        raise RunDirError(f"{what} {path}: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"{what} {path}: {probe} is not writable")


def earlier_run(run_dir: str | os.PathLike, checkpoint_dir: str | None = None) -> str | None:
    """What in `run_dir` belongs to an earlier run (its checkpoint steps, its metrics rows), or None.

    Args:
      run_dir: the local run directory.
      checkpoint_dir: where the checkpoints are (default RUN/checkpoints; may be gs://...).
    """
    from etils import epath

    run_dir = Path(run_dir)
    ckpt = epath.Path(checkpoint_dir) if checkpoint_dir else epath.Path(run_dir / "checkpoints")
    steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit() and p.is_dir()) \
        if ckpt.is_dir() else []
    if steps:
        return f"checkpoints of steps {', '.join(map(str, steps[-3:]))} in {ckpt}"
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        return f"{metrics}"
    return None


def _aside_name(run_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir.with_name(f"{run_dir.name}.old-{stamp}"), 1
    while target.exists():
        target, n = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}"), n + 1
    return target


def start_fresh_run(run_dir: str | os.PathLike, checkpoint_dir: str | None = None, *, overwrite: bool,
                    processes: int = 1) -> Path | None:
    """Makes `run_dir` safe for a fresh run (`checkpoint.resume: false` or `--overwrite-run`).

    Without `overwrite`, a run directory holding an earlier run is refused (RunDirError: a fresh run there
    would write its checkpoints beside the old run's, which the next plain start resumes, and interleave the
    metrics). With `overwrite`, a non-empty run directory is renamed to a sibling `RUN.old-<timestamp>` while
    holding its lock (so a live trainer's directory is refused, never moved); nothing is deleted.

    Returns:
      Where the earlier run was moved, or None when nothing moved.
    """
    from jaxrl.runtime import run_lock

    run_dir = Path(run_dir)
    found = earlier_run(run_dir, checkpoint_dir)
    if not overwrite:
        if found:
            raise RunDirError(f"run directory {run_dir} holds an earlier run ({found}) and "
                              "checkpoint.resume=false would mix the two; use a new --run-dir, or "
                              "--overwrite-run to move the earlier run aside (it is not deleted)")
        return None
    if checkpoint_dir and found and "://" in checkpoint_dir:
        raise RunDirError(f"--overwrite-run moves only a local run directory; the checkpoints in "
                          f"{checkpoint_dir} would stay: use a new --run-dir")
    if processes > 1:
        raise RunDirError("--overwrite-run needs a single process (the processes of a multi-host job would "
                          "race over the move); move the earlier run yourself or use a new --run-dir")
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    target = _aside_name(run_dir)
    with run_lock.RunLock(run_dir):  # refuses a directory a live trainer holds
        os.rename(run_dir, target)
    return target


def check_output_dir(path: str | os.PathLike, *, owns: Callable[[str], bool], overwrite: bool,
                     what: str) -> None:
    """Refuses (RunDirError) an output directory that is a run/checkpoint directory, holds files the writer
    does not own, or (without `overwrite`) is not empty; checks it is writable. Call before loading models."""
    path = Path(path)
    check_writable_dir(path, what)
    if not path.is_dir() or not any(path.iterdir()):
        return
    reason = _is_run_dir(path)
    if reason:
        raise OutputDirError(f"{what} {path} is {reason}; refusing to write into it (even with --overwrite): "
                          "choose a new directory")
    foreign = sorted(p.name for p in path.iterdir() if not owns(p.name))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputDirError(f"{what} {path} holds files this command does not write ({shown}); refusing to "
                          "replace it (even with --overwrite): choose a new or empty directory")
    if not overwrite:
        raise OutputDirError(f"{what} {path} already exists and is not empty; pass --overwrite to replace "
                             "the files this command writes")


@contextlib.contextmanager
def replace_owned_files(path: str | os.PathLike, *, owns: Callable[[str], bool], overwrite: bool,
                        what: str = "output directory") -> Iterator[Path]:
    """Yields a fresh temporary directory next to `path`; on success its entries replace those in `path`.

    Entries of `path` that the writer owns but did not write this time (e.g. shards of an older, differently
    sharded export) are removed; nothing else in `path` is touched. On any exception `path` is unchanged.
    """
    path = Path(path)
    check_output_dir(path, owns=owns, overwrite=overwrite, what=what)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    try:
        yield tmp
        if not path.exists():
            os.rename(tmp, path)
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        written = {p.name for p in tmp.iterdir()}
        for old in path.iterdir():
            if owns(old.name) or old.name in written:
                os.rename(old, trash / old.name)
        for new in tmp.iterdir():
            os.rename(new, path / new.name)
        shutil.rmtree(trash, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
