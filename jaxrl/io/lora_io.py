"""LoRA adapters on disk: adapter-only checkpoints tied to their base by hash, merged HF and PEFT exports.

Adapter checkpoint (`save_adapters` / `load_adapters`), a directory:

    DIR/lora_config.json          {"format": 1, "lora": {rank, alpha, dropout, targets},
                                   "base": {"path": str, "sha256": hex of `base_fingerprint`}}
    DIR/adapters.safetensors      "layers/<self_attn|mlp>/<target>/lora_a|lora_b", float32, stacked [Y, …]

`load_adapters` recomputes the fingerprint of the base it is given and refuses (CheckpointError) a base whose
hash differs from the recorded one, so adapters never silently land on weights they were not trained on. The
arrays are stored bit for bit (float32 safetensors), so a resume continues from exactly the saved adapters.

A trainer run directory stands for its latest adapters wherever an adapter checkpoint is accepted
(`find_adapters`: RUN -> RUN/adapters). A base recorded without a path (a preset model: nothing on disk) is
rebuilt from the run's resolved `config.yaml` beside the adapters (preset, overrides and `train.seed`), and
the recorded fingerprint still decides whether it is the base the adapters were trained on (`load_base`).
`merged_model` gives base + adapters as one model, for `jaxrl sample` and `jaxrl eval` of a LoRA run.

PEFT adapter directories (`export-hf --peft`, `import-hf --peft`): `jaxrl.io.peft_io`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import save_file

from jaxrl.runtime.run_dir import replace_owned_files
from jaxrl.errors import CheckpointError, ConfigError
from jaxrl.models import TransformerConfig
from jaxrl.models import lora
from jaxrl.io._safetensors_dir import read_all
from jaxrl.io.peft_io import export_peft, import_peft, owns_peft_export

CONFIG_FILE = "lora_config.json"
ADAPTERS_FILE = "adapters.safetensors"
FORMAT = 1


def owns_adapter_checkpoint(name: str) -> bool:
    """Whether `save_adapters` (and `import-hf --peft`) writes a file of this name."""
    return name in (CONFIG_FILE, ADAPTERS_FILE)


def base_fingerprint(params: Mapping) -> str:
    """sha256 of a base model's parameters: every leaf's path, shape and float32 little-endian bytes.

    Leaves are visited in sorted path order, one at a time (host memory: one parameter). bfloat16 and its
    exact float32 upcast hash the same. Hash the dense base (before any QLoRA quantisation). With several
    processes, every process must call this (arrays split across hosts are gathered, `_to_host`).
    """
    digest = hashlib.sha256()
    for path, value in sorted(_flatten(params)):
        array = np.ascontiguousarray(_to_host(value).astype(np.float32)).astype("<f4", copy=False)
        digest.update(f"{path}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _to_host(value) -> np.ndarray:
    """A numpy copy of one leaf; a multi-host array not fully addressable here is gathered from every process
    first (a collective: all processes make the same calls in the same order)."""
    import jax

    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils

        value = multihost_utils.process_allgather(value, tiled=True)
    return np.asarray(value)


def _flatten(tree: Mapping, prefix: str = ""):
    for key, sub in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(sub, Mapping):
            yield from _flatten(sub, path)
        else:
            yield path, sub


def _nest(flat: Mapping[str, Any]) -> dict:
    out: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def base_ref(path: str | os.PathLike, params: Mapping) -> dict[str, str]:
    """{"path": str(path), "sha256": base_fingerprint(params)}: what `save_adapters` records."""
    return {"path": str(path), "sha256": base_fingerprint(params)}


def lora_config_from_dict(data: Mapping[str, Any], *, where: str) -> lora.LoraConfig:
    """LoraConfig from a JSON/YAML dict; unknown keys or bad values are a ConfigError naming `where`."""
    known = {"rank", "alpha", "dropout", "targets"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown LoRA keys {unknown}; allowed: {sorted(known)}")
    try:
        return lora.LoraConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e


def save_adapters(directory: str | os.PathLike, adapters: Mapping, cfg: lora.LoraConfig,
                  base: Mapping[str, str], *, overwrite: bool = False) -> Path:
    """Write adapters (host copies, float32) + config + base reference, atomically (`replace_owned_files`).

    Args:
      directory: output directory (created; an existing non-empty one needs `overwrite`, and then only our
        two files are replaced; a run directory or foreign files are refused).
      adapters: tree of `lora.init_adapters` (jax or numpy arrays).
      cfg: the LoRA config the adapters belong to.
      base: `base_ref(path, params)` of the base model.

    Multi-host: every process calls this (the adapters are gathered); only process 0 writes.
    """
    import jax

    if not {"path", "sha256"} <= set(base) <= {"path", "sha256", "preset", "seed"}:
        raise ValueError(f"base reference needs keys path and sha256 (and optionally preset, seed), got "
                         f"{sorted(base)}")
    tensors = {}
    for target, a, b in lora.adapter_pairs(adapters, cfg):
        prefix = f"layers/{lora.SITES[target][0]}/{target}"
        tensors[f"{prefix}/lora_a"] = np.ascontiguousarray(_to_host(a).astype(np.float32))
        tensors[f"{prefix}/lora_b"] = np.ascontiguousarray(_to_host(b).astype(np.float32))
    if jax.process_index() != 0:
        return Path(directory)
    meta = {"format": FORMAT, "lora": {"rank": cfg.rank, "alpha": cfg.alpha, "dropout": cfg.dropout,
                                       "targets": list(cfg.targets)}, "base": dict(base)}
    with replace_owned_files(directory, owns=owns_adapter_checkpoint, overwrite=overwrite,
                             what="adapter checkpoint directory") as tmp:
        save_file(tensors, str(tmp / ADAPTERS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return Path(directory)


def read_adapter_config(directory: str | os.PathLike) -> tuple[lora.LoraConfig, dict[str, str]]:
    """(LoraConfig, base reference) of an adapter checkpoint, without reading the arrays."""
    file = Path(directory) / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{directory} is not a LoRA adapter checkpoint: no {CONFIG_FILE}")
    try:
        meta = json.loads(file.read_text())
        fmt, lora_dict, base = meta["format"], meta["lora"], meta["base"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{file}: not a LoRA adapter config ({e})") from e
    if fmt != FORMAT:
        raise CheckpointError(f"{file}: format {fmt!r}, this jaxrl reads format {FORMAT}")
    try:
        return lora_config_from_dict(lora_dict, where=str(file)), dict(base)
    except ConfigError as e:
        raise CheckpointError(str(e)) from e


def load_adapters(directory: str | os.PathLike, base_params: Mapping) -> tuple[dict, lora.LoraConfig]:
    """(adapters as numpy float32, LoraConfig) of `directory`, checked against `base_params`.

    Raises CheckpointError when the base's fingerprint differs from the recorded one (naming both hashes and
    the recorded base path) or when an adapter's shape does not fit the base's kernel.
    """
    cfg, base = read_adapter_config(directory)
    found = base_fingerprint(base_params)
    if found != base.get("sha256"):
        raise CheckpointError(
            f"{directory}: the adapters were trained on base {base.get('path')!r} (sha256 "
            f"{str(base.get('sha256'))[:16]}…), but the given base weights hash to {found[:16]}…; load the "
            "matching base model")
    file = Path(directory) / ADAPTERS_FILE
    flat = read_all(file, "LoRA adapters")
    adapters = _nest(flat)
    check_adapters(adapters, cfg, base_params, where=str(file))
    return adapters, cfg


def check_adapters(adapters: Mapping, cfg: lora.LoraConfig, params: Mapping, *, where: str) -> None:
    """CheckpointError unless `adapters` hold exactly cfg's targets with shapes that fit `params`."""
    expected = set()
    for target in cfg.targets:
        block, num_in, _ = lora.SITES[target]
        kernel = lora.lookup(params, lora.kernel_path(target)).shape
        want_a = tuple(kernel[:1 + num_in]) + (cfg.rank,)
        want_b = (kernel[0], cfg.rank) + tuple(kernel[1 + num_in:])
        for leaf, want in (("lora_a", want_a), ("lora_b", want_b)):
            path = f"layers/{block}/{target}/{leaf}"
            expected.add(path)
            try:
                got = tuple(lora.lookup(adapters, tuple(path.split("/"))).shape)
            except KeyError:
                raise CheckpointError(f"{where}: adapter {path} is missing") from None
            if got != want:
                raise CheckpointError(f"{where}: adapter {path} has shape {got}, the base needs {want}")
    extra = sorted(set(p for p, _ in _flatten(adapters)) - expected)
    if extra:
        raise CheckpointError(f"{where}: unexpected adapter tensors {extra[:4]} "
                              f"(targets: {list(cfg.targets)})")


# ------------------------------------------------------------------------------------------ HF exports

def export_merged(model_cfg: TransformerConfig, params: Mapping, adapters: Mapping, cfg: lora.LoraConfig,
                  out: str | os.PathLike, *, tokenizer=None, max_shard_size: int | str = "5GB",
                  overwrite: bool = False) -> Path:
    """Write base + adapters merged (W + (α/r)·A·B, `lora.merge`) as a full HF directory."""
    from jaxrl.io import hf
    from jaxrl.io.model_io import model_from_params

    merged = lora.merge(params, adapters, cfg)
    model = model_from_params(model_cfg, merged, where="merged LoRA model")
    return hf.save_pretrained(model, out, tokenizer=tokenizer, max_shard_size=max_shard_size,
                              overwrite=overwrite)


# ------------------------------------------------------------------------------------------ CLI entry points

def find_adapters(path: str | os.PathLike) -> Path | None:
    """The adapter checkpoint that `path` stands for: `path` itself, or a LoRA run directory's RUN/adapters;
    None when `path` is neither. CheckpointError (one line saying what to pass) for a run with one adapter set
    per role, and for a checkpoint directory inside a LoRA run (its orbax state holds adapters only)."""
    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        return path
    adapters = path / "adapters"
    if (adapters / CONFIG_FILE).is_file():
        return adapters
    if adapters.is_dir():
        roles = sorted(p.name for p in adapters.iterdir() if (p / CONFIG_FILE).is_file())
        if roles:
            raise CheckpointError(f"{path} holds one adapter set per role ({', '.join(roles)}): pass "
                                  f"--checkpoint {adapters}/<role>")
    for run in list(path.absolute().parents)[:2]:  # RUN/checkpoints or RUN/checkpoints/<step>
        if (run / "adapters" / CONFIG_FILE).is_file() and path.absolute().is_relative_to(run / "checkpoints"):
            raise CheckpointError(f"{path} is a training checkpoint of the LoRA run {run} (adapters only): "
                                  f"pass --checkpoint {run} (its latest adapters on their base), or export "
                                  f"them: jaxrl export-hf --checkpoint {run} --out DIR")
    return None


def load_base(adapter_dir: str | os.PathLike, base: str | os.PathLike | None = None):
    """(model, tokenizer, description) of the base of the adapters in `adapter_dir`: `base` when given, else
    the recorded path, else (a preset base, recorded without a path) rebuilt from the run's `config.yaml`
    beside the adapters. `load_adapters` then checks it against the recorded fingerprint."""
    from jaxrl.io import model_io

    adapter_dir = Path(adapter_dir)
    _, ref = read_adapter_config(adapter_dir)
    if base is not None or ref.get("path"):
        path = Path(base if base is not None else ref["path"])
        if not path.exists():
            raise CheckpointError(f"base model {path} of the adapters in {adapter_dir} not found; pass "
                                  "--base")
        model, tokenizer = model_io.load_model(path)
        return model, tokenizer, str(path)
    for config_file in (adapter_dir.parent / "config.yaml", adapter_dir.parent.parent / "config.yaml"):
        if config_file.is_file():
            return _rebuild_base(config_file)
    raise CheckpointError(f"{adapter_dir}: the adapters' base is a preset model (no path recorded) and no "
                          "run config.yaml lies beside them to rebuild it from; pass --base (an HF directory or "
                          "jaxrl checkpoint of the base)")


def _rebuild_base(config_file: Path):
    """The run's base model as its trainer built it (`jaxrl.io.build`, the same preset, overrides and seed).
    The resolved config is the only record of a preset base's recipe, hence the config import here."""
    from jaxrl.io import build
    from jaxrl.config import load_config

    cfg = load_config(config_file)
    tokenizer = build.build_tokenizer(cfg.model, cfg.tokenizer)
    # the attention kernel the run used (say cudnn on its GPU) is this machine's choice here: it changes no
    # parameter
    model_cfg = dataclasses.replace(cfg.model, attention="auto")
    model = build.build_model(model_cfg, vocab_size=len(tokenizer), seed=cfg.train.seed)
    what = cfg.model.preset or cfg.model.hf_path or cfg.model.checkpoint
    return model, tokenizer, f"{what} (train.seed {cfg.train.seed}, rebuilt from {config_file})"


def merged_model(adapter_dir: str | os.PathLike, base: str | os.PathLike | None = None):
    """(model, tokenizer): the adapters of `adapter_dir` (or of a LoRA run directory) merged into their base
    (W + (α/r)·A·B), checked against the recorded fingerprint; what `jaxrl sample` and `jaxrl eval` run for
    a LoRA run."""
    from flax import nnx

    from jaxrl.io.model_io import model_from_params

    adapter_dir = find_adapters(adapter_dir) or adapter_dir
    model, tokenizer, _ = load_base(adapter_dir, base)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    adapters, cfg = load_adapters(adapter_dir, params)
    merged = model_from_params(model.cfg, lora.merge(params, adapters, cfg), where="merged LoRA model")
    return merged, tokenizer


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, *, mode: str,
                      base: str | os.PathLike | None = None, max_shard_size: int | str = "5GB",
                      overwrite: bool = False) -> Path:
    """`jaxrl export-hf --merge|--peft`: adapters of `checkpoint` on their base (recorded path or `base`).

    mode "merge" writes a full HF model (W + (α/r)·A·B); "peft" writes a PEFT adapter directory whose
    `base_model_name_or_path` is the base path. The base (HF directory or jaxrl checkpoint) must hash to the
    fingerprint recorded with the adapters.
    """
    from flax import nnx

    from jaxrl.runtime import run_dir

    if mode not in ("merge", "peft"):
        raise ValueError(f"mode must be 'merge' or 'peft', got {mode!r}")
    owns = run_dir.owns_hf_export if mode == "merge" else owns_peft_export
    run_dir.check_output_dir(out, owns=owns, overwrite=overwrite, what="--out")  # before loading anything
    checkpoint = find_adapters(checkpoint) or checkpoint  # a LoRA run directory: its RUN/adapters
    model, tokenizer, base_name = load_base(checkpoint, base)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    adapters, cfg = load_adapters(checkpoint, params)
    if mode == "peft":
        return export_peft(adapters, cfg, out, base_model=base_name, overwrite=overwrite)
    return export_merged(model.cfg, params, adapters, cfg, out, tokenizer=tokenizer,
                         max_shard_size=max_shard_size, overwrite=overwrite)


def import_peft_checkpoint(peft_dir: str | os.PathLike, hf_dir: str | os.PathLike, out: str | os.PathLike, *,
                           overwrite: bool = False) -> list[str]:
    """`jaxrl import-hf --peft DIR --hf BASE`: a PEFT adapter as a jaxrl adapter checkpoint tied to BASE.

    Returns the notes of `import_peft` (settings read but not used), for the CLI to print.
    """
    from flax import nnx

    from jaxrl.io import hf
    from jaxrl.runtime import run_dir

    run_dir.check_output_dir(out, owns=owns_adapter_checkpoint, overwrite=overwrite, what="--out")
    params = nnx.state(hf.from_pretrained(hf_dir), nnx.Param).to_pure_dict()
    adapters, cfg, notes = import_peft(peft_dir, params)
    save_adapters(out, adapters, cfg, base_ref(Path(hf_dir).absolute(), params), overwrite=overwrite)
    return notes
