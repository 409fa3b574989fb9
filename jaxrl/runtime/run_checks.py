"""What `jaxrl train` checks before it builds a model or writes a file (`validate_train`).

The run directory is a writable directory, an HF model has its tokenizer files, and an existing run can be
resumed by this config (`check_resume`). A failure raises a `UserError` naming every differing field, and
nothing in the run directory has been touched (a failed resume used to rewrite `config.yaml` and
`model_config.json` first, after which `sample` and `export-hf` failed on the original checkpoints).
The file-ownership helpers these checks share with the exporters live in `jaxrl.runtime.run_dir`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from jaxrl.runtime import trackers
from jaxrl.errors import ConfigError
from jaxrl.runtime.run_dir import EXECUTION_ONLY, TOKENIZER_FILES, check_writable_dir

CRITIC_INIT = "algorithm.ppo.critic_init"


def check_tokenizer_source(cfg: Any) -> None:
    """An HF directory or checkpoint as the model needs its own tokenizer files unless `tokenizer:` names one
    (a 49k-vocabulary model must not silently train with the 102-character built-in tokenizer)."""
    from jaxrl.io import model_io

    if cfg.tokenizer.kind == "hf":
        return
    source = cfg.model.hf_path or cfg.model.checkpoint
    if source is None:
        return
    key = "model.hf_path" if cfg.model.hf_path else "model.checkpoint"
    candidates = [Path(source)]
    if cfg.model.checkpoint:
        with contextlib.suppress(Exception):
            candidates.insert(0, model_io.resolve_checkpoint(source)[0])
    if not any(model_io.has_tokenizer_files(c) for c in candidates):
        raise ConfigError(f"{key}={source}: no tokenizer files there ({', '.join(TOKENIZER_FILES[:2])}); "
                          "set tokenizer.kind=hf and tokenizer.path=DIR to the model's tokenizer")


_TEACHER = "algorithm.distill.teacher"


def check_teacher(path: str, tokenizer, *, key: str = _TEACHER, what: str = "teacher") -> Path:
    """The model at `path` that reads the policy's token ids (the on-policy distillation teacher; PPO's
    critic, `key` "algorithm.ppo.critic_init", `what` "critic"), a jaxrl run / checkpoint directory or an HF
    directory: its saved tokenizer is `tokenizer` and its embedding covers it. Reads the configs and tokenizer
    files only; returns the directory. ConfigError (one line) otherwise."""
    from jaxrl.io import hf, model_io
    from jaxrl.errors import CheckpointError

    where = Path(path).expanduser()
    if not where.is_dir():
        raise ConfigError(f"{key}={path!r}: no such directory (allowed: a jaxrl run or checkpoint "
                          "directory, or an HF directory with config.json and safetensors)")
    try:
        if (where / "config.json").is_file() and not (where / model_io.CONFIG_FILE).is_file():
            vocab, source = hf.config_from_pretrained(where).vocab_size, where
        else:
            source = model_io.resolve_checkpoint(where)[0]
            vocab = model_io.load_config(source).vocab_size
        other_tok = model_io.load_tokenizer(source)
    except (OSError, ValueError, CheckpointError) as e:
        raise ConfigError(f"{key}={path!r}: cannot load a model there: {str(e).splitlines()[0]}") from None
    check_same_tokenizer(other_tok, tokenizer, vocab, path, key=key, what=what)
    return where


def check_same_tokenizer(teacher_tok, student_tok, teacher_vocab: int, path: str, *, key: str = _TEACHER,
                         what: str = "teacher") -> None:
    """The `what` (teacher, critic) must read the student's (policy's) token ids: its tokenizer (saved with
    it) must be the student's (size, special tokens, vocabulary) and its embedding must cover the student's
    vocabulary."""
    if teacher_tok is None:
        raise ConfigError(f"{key}={path!r}: the {what} has no saved tokenizer, so jaxrl cannot check "
                          f"that it reads the student's token ids (save the {what} with its tokenizer: a jaxrl "
                          "run directory or an HF directory with tokenizer files)")
    got, want = _tokenizer_summary(teacher_tok), _tokenizer_summary(student_tok)
    differ = [k for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id") if got[k] != want[k]]
    if not differ and got["vocabulary"] != want["vocabulary"]:
        differ = ["vocabulary (same size, different tokens)"]
    if differ:
        raise ConfigError(f"{key}={path!r}: the {what}'s tokenizer is not the student's ({', '.join(differ)} "
                          f"differ: {got['vocab_size']} tokens vs the student's {want['vocab_size']}); "
                          f"the {what} needs the policy's tokenizer")
    if teacher_vocab < len(student_tok):
        raise ConfigError(f"{key}={path!r}: the {what}'s embedding has {teacher_vocab} rows for the "
                          f"student's {len(student_tok)} tokens")


def check_other_models(cfg: Any) -> None:
    """`algorithm.distill.teacher` and PPO's `algorithm.ppo.critic_init`, when they name a model, are models
    with the policy's tokenizer (`check_teacher`; a critic path is checked whatever the algorithm: a path
    set is meant to be read)."""
    teacher = cfg.algorithm.distill.teacher
    critic = cfg.algorithm.ppo.critic_init
    if teacher is None and critic == "policy":
        return
    from jaxrl.io import build

    tokenizer = build.build_tokenizer(cfg.model, cfg.tokenizer)
    if teacher is not None:
        check_teacher(teacher, tokenizer)
    if critic != "policy":
        check_teacher(critic, tokenizer, key=CRITIC_INIT, what="critic")


def validate_train(cfg: Any, run_dir: str | os.PathLike, checkpoint_dir: str | None = None) -> None:
    """Everything `jaxrl train` checks before building a model: writable run directory, the trackers'
    packages, the attention kernel's platform, tokenizer presence, the distillation teacher and a critic's
    path, resume compatibility."""
    from jaxrl.io import build

    check_writable_dir(run_dir, "run directory")
    trackers.check_installed(cfg.logging.trackers)  # a missing extra: one line, before anything heavy
    build.attention_kernel(cfg.model)  # model.attention: cudnn on a machine without a GPU
    check_tokenizer_source(cfg)
    check_other_models(cfg)
    check_resume(cfg, run_dir, checkpoint_dir)


def _stored_steps(ckpt_dir) -> list[int]:
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit() and p.is_dir())


def _name(value: Any) -> Any:
    return getattr(value, "value", value)  # enums as their YAML spelling


def _diff(prefix: str, stored: dict, new: dict, keys) -> list[str]:
    return [f"{prefix}{k}: {stored.get(k)!r} in the run, {new.get(k)!r} in this config"
            for k in keys if stored.get(k) != new.get(k)]


def _expected_model(cfg: Any, tokenizer) -> dict:
    """The TransformerConfig (as JSON) `jaxrl.io.build.build_model` would produce, without loading weights."""
    from jaxrl.io import build
    from jaxrl.io import hf, model_io

    m = cfg.model
    if m.preset is not None:
        model_cfg = build.preset_config(m, len(tokenizer))
    elif m.hf_path is not None:  # as `build_model` loads them: dtype and param_dtype follow model.dtype
        model_cfg = hf.config_from_pretrained(m.hf_path, dtype=m.dtype)
    else:
        stored = model_io.load_config(model_io.resolve_checkpoint(m.checkpoint)[0])
        model_cfg = stored.replace(dtype=m.dtype, param_dtype=m.dtype)
    return model_io.config_to_json(model_cfg)


def _tokenizer_summary(tok) -> dict:
    vocab = tok.get_vocab()
    return {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id, "vocabulary": hash(tuple(sorted(vocab.items())))}


def _reward_columns(rewards) -> list[str]:
    """`name: type` (`name: function module:attr` for a function reward) of each reward, in order: the
    columns of every rollout's reward matrix, its per-reward metrics and GDPO's per-reward normalisation."""
    def column(r) -> str:
        get = r.get if isinstance(r, dict) else lambda k: getattr(r, k, None)
        kind = _name(get("type") or "function")
        return f"{get('name')}: {kind}" + (f" {get('function')}" if kind == "function" else "")
    return [column(r) for r in rewards or ()]


def _reward_change(stored, rewards) -> list[str]:
    """The problem line when this config's rewards are not the run's (names, types, order); weights and
    params may change on resume."""
    old, new = _reward_columns(stored), _reward_columns(rewards)
    if stored is None or old == new:
        return []
    return [f"rewards: [{', '.join(old)}] in the run, [{', '.join(new)}] in this config (weights and params may "
            "change on resume; the reward columns may not)"]


def check_resume(cfg: Any, run_dir: str | os.PathLike, checkpoint_dir: str | None = None) -> None:
    """Refuses (ConfigError) to continue a run whose checkpoints this config cannot resume, naming every
    differing field: model config, tokenizer, algorithm, the rewards' names and types; and checks that the
    stored model's parameters divide over this config's mesh. Reads only; does nothing when the run has no
    checkpoint step yet.

    Args:
      cfg: the `ExperimentConfig` about to train.
      run_dir: the run directory (holds `config.yaml` of the previous run).
      checkpoint_dir: where the checkpoints are (default RUN/checkpoints; may be gs://...).
    """
    import json

    import yaml
    from etils import epath

    from jaxrl.io import build
    from jaxrl.io import model_io

    ckpt_dir = epath.Path(checkpoint_dir) if checkpoint_dir else epath.Path(Path(run_dir) / "checkpoints")
    stored_file = ckpt_dir / model_io.CONFIG_FILE
    if not stored_file.exists() or not _stored_steps(ckpt_dir):
        return
    try:
        stored = json.loads(stored_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {stored_file} of the run being resumed: {e}") from None
    tokenizer = build.build_tokenizer(cfg.model, cfg.tokenizer)
    problems = _diff("model ", stored, _expected_model(cfg, tokenizer),
                     [k for k in stored if k not in EXECUTION_ONLY])
    if Path(os.fspath(ckpt_dir)).is_dir():  # local checkpoints: compare the tokenizer saved with them
        old_tok = model_io.load_tokenizer(Path(os.fspath(ckpt_dir)))
        if old_tok is not None:
            old, new = _tokenizer_summary(old_tok), _tokenizer_summary(tokenizer)
            problems += _diff("tokenizer ", old, new, [k for k in old if k != "vocabulary"])
            if old["vocabulary"] != new["vocabulary"] and old["vocab_size"] == new["vocab_size"]:
                problems.append("tokenizer vocabulary: same size, different tokens")
    config_yaml = Path(run_dir) / "config.yaml"
    if config_yaml.is_file():
        try:
            previous = yaml.safe_load(config_yaml.read_text()) or {}
        except yaml.YAMLError:
            previous = {}
        old_algo = (previous.get("algorithm") or {}).get("name")
        if old_algo is not None and old_algo != _name(cfg.algorithm.name):
            problems.append(f"algorithm.name: {old_algo!r} in the run, {_name(cfg.algorithm.name)!r} in this "
                            "config")
        problems += _reward_change(previous.get("rewards"), cfg.rewards)
    if problems:
        raise ConfigError(f"cannot resume the run in {run_dir} with this config: {'; '.join(problems)}; "
                          "use a new --run-dir, or the run's own settings (its config.yaml)")
    _check_mesh(cfg, model_io.config_from_json(stored, where=str(stored_file)))


def _check_mesh(cfg: Any, model_cfg) -> None:
    """The stored model's parameters must split evenly over this config's mesh (ConfigError naming the
    tensor)."""
    from flax import nnx

    from jaxrl.models import Transformer
    from jaxrl.sharding import RULES, make_mesh, state_shardings

    state_shardings(nnx.state(Transformer.abstract(model_cfg), nnx.Param), make_mesh(cfg.mesh),
                    RULES[cfg.mesh.rules])
