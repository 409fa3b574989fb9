"""Run and output directories: what may be written where, checked before any model is built or any
file is written.

* `check_writable_dir`, `check_output_dir`: the directory checks of `jaxrl train` (`jaxrl.run_checks`) and of
  the exporters.
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
from pathlib import Path
from typing import Callable, Iterator

from jaxrl.errors import OutputDirError, RunDirError

# TransformerConfig fields that change how the forward pass runs but not the parameters; they may change on
# resume. Token ids are compared through the tokenizer.
EXECUTION_ONLY = ("dtype", "remat", "scan_layers", "bos_token_id", "eos_token_id", "pad_token_id")
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
