"""jaxrl's own model checkpoints: `model_config.json` + an orbax `params/` item (+ optional `tokenizer/`).

Layout of a model checkpoint directory (`save_model_checkpoint`, `jaxrl import-hf`):

    CKPT/model_config.json   TransformerConfig as JSON (`config_to_json`)
    CKPT/params/             orbax StandardCheckpointer item: `nnx.state(model, nnx.Param).to_pure_dict()`
    CKPT/tokenizer/          optional, `tokenizer.save_pretrained`

`load_model_checkpoint` also reads the trainer's layout (see docs/DESIGN.md, "Checkpoint layout"):

    RUN/checkpoints/model_config.json, RUN/checkpoints/tokenizer/, RUN/checkpoints/<step>/params/

given RUN (latest step), RUN/checkpoints (latest step) or RUN/checkpoints/<step>.
Weights are restored straight into an abstract model (`nnx.eval_shape`), so no random init is materialised.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from jaxrl.errors import CheckpointError
from jaxrl.io.model_params import model_from_params, token_ids  # noqa: F401 -- re-exported
from jaxrl.models import Llama3RopeScaling, Transformer, TransformerConfig
from jaxrl.runtime.run_dir import owns_model_checkpoint, replace_owned_files

CONFIG_FILE = "model_config.json"
PARAMS_ITEM = "params"
TOKENIZER_DIR = "tokenizer"


def config_to_json(cfg: TransformerConfig) -> dict[str, Any]:
    """TransformerConfig -> JSON-able dict (nested rope scaling as a dict, tuples as lists), without the
    attention kernel: it belongs to the machine that runs the model (`jaxrl.io.build.attention_kernel`)."""
    data = dataclasses.asdict(cfg)
    data.pop("attention")
    return data


def config_from_json(data: dict[str, Any], *, where: str = "model_config.json") -> TransformerConfig:
    """Inverse of `config_to_json`; unknown or invalid fields are a `CheckpointError` naming `where`."""
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise CheckpointError(f"{where}: unknown TransformerConfig fields {unknown}; known: {sorted(fields)}")
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
        if isinstance(data.get("rope_scaling"), dict):
            data["rope_scaling"] = Llama3RopeScaling(**data["rope_scaling"])
        return TransformerConfig(**data)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: invalid model config: {e}") from e


def abstract_model(cfg: TransformerConfig) -> Transformer:
    """The model with ShapeDtypeStruct leaves: structure only, no memory, no random init."""
    return Transformer.abstract(cfg)


def save_model_checkpoint(model: Transformer, path: str | os.PathLike, tokenizer=None, *,
                          overwrite: bool = False) -> Path:
    """Write `model` (and `tokenizer`) as a jaxrl model checkpoint directory.

    Written next to `path` first; an existing `path` needs `overwrite=True` and then only `model_config.json`,
    `params/` and `tokenizer/` are replaced. A run directory, a trainer checkpoint directory or any other file
    in `path` is refused (`OutputDirError`) before anything is written. The stored token ids are the
    tokenizer's when one is given.
    """
    config = config_to_json(model.cfg)
    if tokenizer is not None:
        config.update(token_ids(tokenizer, model.cfg.eos_token_id))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    with replace_owned_files(path, owns=owns_model_checkpoint, overwrite=overwrite,
                             what="checkpoint directory") as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(Path(tmp).absolute() / PARAMS_ITEM, params)  # orbax wants an absolute path
            checkpointer.wait_until_finished()
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
    return Path(path)


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, Path]:
    """(directory holding model_config.json [+ tokenizer/], params item directory) of any accepted layout."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if (path / CONFIG_FILE).is_file() and (path / PARAMS_ITEM).is_dir():
        return path, path / PARAMS_ITEM  # a model checkpoint
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"  # a trainer run directory
    if (path / CONFIG_FILE).is_file():
        steps = sorted((int(p.name), p) for p in path.iterdir() if p.is_dir() and p.name.isdigit())
        steps = [(n, p) for n, p in steps if (p / PARAMS_ITEM).is_dir()]
        if not steps:
            raise CheckpointError(f"{path}: no finished step directories <step>/{PARAMS_ITEM}/")
        return path, steps[-1][1] / PARAMS_ITEM  # latest step of RUN/checkpoints
    if path.name.isdigit() and (path / PARAMS_ITEM).is_dir() and (path.parent / CONFIG_FILE).is_file():
        return path.parent, path / PARAMS_ITEM  # one step: RUN/checkpoints/<step>
    raise CheckpointError(
        f"{path} is not a jaxrl checkpoint: expected {CONFIG_FILE} + {PARAMS_ITEM}/, a trainer run directory "
        f"(checkpoints/{CONFIG_FILE}, checkpoints/<step>/{PARAMS_ITEM}/) or a step directory"
    )


def load_config(config_dir: Path) -> TransformerConfig:
    """The TransformerConfig stored in `config_dir/model_config.json`."""
    file = Path(config_dir) / CONFIG_FILE
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {file}: {e}") from e
    return config_from_json(data, where=str(file))


def has_tokenizer_files(directory: str | os.PathLike) -> bool:
    """Whether `directory/tokenizer/` or `directory` holds an HF tokenizer (tokenizer.json or
    tokenizer_config.json)."""
    directory = Path(directory)
    return any((c / "tokenizer.json").is_file() or (c / "tokenizer_config.json").is_file()
               for c in (directory / TOKENIZER_DIR, directory))


def load_tokenizer(directory: str | os.PathLike):
    """`AutoTokenizer` saved in `directory/tokenizer/` or `directory`, or None when there is none.

    Offline and without remote code: a directory whose config.json names custom code (our SiameseNorm
    exports) loads its tokenizer without asking to run that code, and never runs anyone else's.
    """
    directory = Path(directory)
    for candidate in (directory / TOKENIZER_DIR, directory):
        if (candidate / "tokenizer.json").is_file() or (candidate / "tokenizer_config.json").is_file():
            from jaxrl.io.tokenizer import from_pretrained_dir

            return from_pretrained_dir(candidate)
    return None


def restore_params(params_dir: Path, abstract: nnx.Module, what: str) -> dict:
    """The orbax `params` item at `params_dir`, restored onto this host's first device (multi-host: every
    process loads its own copy) in the shapes and dtypes of the abstract module's parameters; an unreadable or
    mismatching item is a CheckpointError naming `what`."""
    target = nnx.state(abstract, nnx.Param).to_pure_dict()
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this host's: multi-host
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), target)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(params_dir.absolute(), target)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise CheckpointError(f"cannot restore {what}: {e}") from e


def load_model_checkpoint(path: str | os.PathLike, *, dtype: str | None = None):
    """Load a jaxrl model checkpoint, trainer run directory or trainer step directory.

    Args:
      path: see `resolve_checkpoint` for the accepted layouts.
      dtype: compute and parameter dtype override ("float32" / "bfloat16"); None keeps the saved config.

    Returns:
      (model, tokenizer or None).
    """
    config_dir, params_dir = resolve_checkpoint(path)
    cfg = load_config(config_dir)
    if dtype is not None:
        cfg = cfg.replace(dtype=dtype, param_dtype=dtype)
    params = restore_params(params_dir, abstract_model(cfg),
                            f"parameters from {params_dir} for the config in {config_dir / CONFIG_FILE}")
    return model_from_params(cfg, params, where=str(params_dir)), load_tokenizer(config_dir)


def load_model(path: str | os.PathLike, *, dtype: str | None = None):
    """(model, tokenizer or None) from an HF directory (config.json) or any jaxrl checkpoint layout."""
    path = Path(path)
    if (path / "config.json").is_file() and not (path / CONFIG_FILE).is_file():
        from jaxrl.io import hf

        return hf.from_pretrained(path, dtype=dtype or "float32"), load_tokenizer(path)
    return load_model_checkpoint(path, dtype=dtype)
