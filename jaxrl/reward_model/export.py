"""HF export/import of reward models as `{Llama,Qwen2,Qwen3}ForSequenceClassification` with num_labels = 1.

Layout written: config.json (the family's CausalLM config keys, `architectures` set to the sequence
classification class, one label, `pad_token_id` set), `model.safetensors` with the backbone under
`model.*` (the `jaxrl.models.hf_io` table) plus `score.weight` `[1, D]`, and the tokenizer when given.
transformers pools the logits at the rightmost token ≠ pad_token_id, which is the token `RewardModel` reads, so
`AutoModelForSequenceClassification.from_pretrained(dir)(ids).logits[:, 0]` equals our scores.
Only pre-norm models have a standard architecture; post-norm / SiameseNorm reward models cannot be exported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from flax import nnx

from jaxrl.io._safetensors_dir import TensorReader, atomic_output_dir, parse_size, write_tensors
from jaxrl.errors import CheckpointError
from jaxrl.models import hf_io
from jaxrl.reward_model.model import RewardModel, rm_backbone_config

SEQ_CLS = {"llama": "LlamaForSequenceClassification", "qwen2": "Qwen2ForSequenceClassification",
           "qwen3": "Qwen3ForSequenceClassification"}
_CAUSAL = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_rm_config(model: RewardModel) -> dict:
    """config.json contents of the exported sequence-classification model."""
    cfg = model.cfg
    if cfg.norm != "pre":
        raise CheckpointError(f"cannot export a {cfg.norm}-norm reward model: transformers' sequence "
                              "classification classes are pre-norm only")
    config = hf_io.config_to_hf(cfg)
    config.update(architectures=[SEQ_CLS[cfg.family]], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
                  dtype=cfg.param_dtype)
    return config


def export_reward_model(model: RewardModel, path: str | os.PathLike, tokenizer=None, *,
                        max_shard_size: int | str = "5GB", overwrite: bool = False) -> Path:
    """Writes `model` as an HF `*ForSequenceClassification` directory (atomic)."""
    config = hf_rm_config(model)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    shapes = hf_io.hf_shapes(model.cfg)
    backbone = ((name, value.reshape(shapes[name])) for name, value in hf_io.params_to_hf(model.cfg,
                                                                                         params["backbone"]))

    def tensors():
        yield from backbone
        yield "score.weight", np.ascontiguousarray(np.asarray(params["score"]).T)

    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        write_tensors(tmp, tensors(), parse_size(max_shard_size))
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return Path(path)


def import_reward_model(path: str | os.PathLike, *, dtype: str = "float32") -> RewardModel:
    """A `RewardModel` from an HF `{Llama,Qwen2,Qwen3}ForSequenceClassification` directory with one label."""
    from jaxrl.io.hf import read_hf_config

    hf = read_hf_config(path)
    arch = (hf.get("architectures") or [None])[0]
    family = {v: k for k, v in SEQ_CLS.items()}.get(arch)
    if family is None:
        raise CheckpointError(f"{path}: architecture {arch!r} is not a supported reward model; "
                              f"supported: {sorted(SEQ_CLS.values())}")
    labels = len(hf.get("id2label") or {}) or int(hf.get("num_labels", 2))
    if labels != 1:
        raise CheckpointError(f"{path}: a reward model has num_labels=1, this config has {labels}")
    try:
        cfg = hf_io.config_from_hf({**hf, "architectures": [_CAUSAL[family]]})
        cfg = rm_backbone_config(cfg.replace(dtype=dtype, param_dtype=dtype))
    except ValueError as e:
        raise CheckpointError(f"{Path(path) / 'config.json'}: {e}") from e
    expected = hf_io.hf_shapes(cfg)
    with TensorReader(path) as reader:
        backbone = hf_io.hf_to_params(cfg, lambda name: reader.get(name, expected_shape=expected[name]))
        score = reader.get("score.weight", expected_shape=(1, cfg.hidden_size))
    return RewardModel.from_params(cfg, {"backbone": backbone, "score": np.asarray(score).T})
