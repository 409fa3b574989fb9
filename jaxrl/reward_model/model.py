"""Reward model: a `jaxrl.models.Transformer` backbone + a scalar linear head on the last non-padding token.

    r(x) = w_score · h_L(x)[t*],   t* = max{t : x_t ≠ pad}   (HF `*ForSequenceClassification` pooling rule)

h_L is the final *normed* hidden state (the LM-head input). `t*` is picked exactly as transformers does
(rightmost token that differs from `pad_token_id`), so left and right padding both work and scores match an
exported `LlamaForSequenceClassification` / `Qwen2…` / `Qwen3…`.

Deviations / choices:
* The backbone config is forced to `tie_embeddings=True`: the LM head is never used by a reward model,
  and with tied embeddings the backbone has no `lm_head` parameter to carry (a pretrained untied LM loses
  its head).
* `score` is a `[D, 1]` kernel without bias (HF `score = Linear(D, 1, bias=False)`), initialised N(0, 0.02²).
* A checkpoint is the jaxrl model layout (`model_config.json` + orbax `params/` of the whole RM tree
  `{backbone, score}`) plus a `reward_model.json` marker; trainer run directories are read too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from jaxrl.io import model_io
from jaxrl.io._safetensors_dir import atomic_output_dir
from jaxrl.errors import CheckpointError
from jaxrl.models import Transformer, TransformerConfig

RM_MARKER = "reward_model.json"


def rm_backbone_config(cfg: TransformerConfig, pad_token_id: int | None = None) -> TransformerConfig:
    """The backbone config of a reward model: tied embeddings (no LM head), `pad_token_id` set if given."""
    changes = {"tie_embeddings": True}
    if pad_token_id is not None:
        changes["pad_token_id"] = int(pad_token_id)
    cfg = cfg.replace(**changes)
    if cfg.pad_token_id is None:
        raise ValueError("a reward model needs cfg.pad_token_id (the head reads the last non-pad token)")
    return cfg


def last_token_index(tokens_BL: jax.Array, pad_id: int) -> jax.Array:
    """t*_B = index of the rightmost token ≠ pad (0 for an all-pad row), as HF sequence classification."""
    chex.assert_rank(tokens_BL, 2)
    positions_BL = jnp.arange(tokens_BL.shape[1], dtype=jnp.int32)[None, :]
    return jnp.argmax(positions_BL * (tokens_BL != pad_id).astype(jnp.int32), axis=-1)


class RewardModel(nnx.Module):
    """Backbone + scalar head. `__call__(tokens_BL, mask_BL)` returns (scores_B float32, pooled hidden
    h_BD)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        cfg = rm_backbone_config(cfg)
        self.cfg = cfg
        self.backbone = Transformer(cfg, rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.score = nnx.Param(init(rngs.params(), (cfg.hidden_size, 1), jnp.dtype(cfg.param_dtype)))

    @classmethod
    def abstract(cls, cfg: TransformerConfig) -> "RewardModel":
        return nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))

    @classmethod
    def from_params(cls, cfg: TransformerConfig, params: dict) -> "RewardModel":
        """An RM holding `params` = {"backbone": Transformer pure dict, "score": [D, 1]} (no random init)."""
        model = cls.abstract(cfg)
        state = nnx.state(model, nnx.Param)
        want = state.to_pure_dict()
        if set(params) != set(want):
            raise KeyError(f"reward-model params need keys {sorted(want)}, got {sorted(params)}")
        if tuple(params["score"].shape) != tuple(want["score"].shape):
            raise ValueError(f"param score: expected shape {tuple(want['score'].shape)}, "
                             f"found {tuple(params['score'].shape)}")
        backbone = model_io.model_from_params(model.cfg, params["backbone"], where="reward model backbone")
        model.backbone = backbone
        model.score = nnx.Param(jnp.asarray(params["score"], jnp.dtype(model.cfg.param_dtype)))
        return model

    @classmethod
    def from_backbone(cls, backbone: Transformer, pad_token_id: int | None, *,
                      seed: int = 0) -> "RewardModel":
        """Wraps a (pretrained) LM: its transformer weights, a freshly initialised head; the LM head is
        dropped."""
        cfg = rm_backbone_config(backbone.cfg, pad_token_id)
        params = nnx.state(backbone, nnx.Param).to_pure_dict()
        params.pop("lm_head", None)
        head = cls.abstract(cfg)
        score = nnx.initializers.normal(0.02)(jax.random.key(seed), (cfg.hidden_size, 1),
                                               jnp.dtype(cfg.param_dtype))
        return cls.from_params(head.cfg, {"backbone": params, "score": score})

    def __call__(self, tokens_BL: jax.Array, mask_BL: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Scores r_B (float32) and the pooled final hidden state h_BD at t* (the head's input, with
        gradient).

        Args:
          tokens_BL: [B, L] int token ids, padded with `cfg.pad_token_id` (either side).
          mask_BL: [B, L] attention mask (1 = real token); None derives it as tokens ≠ pad.
        """
        chex.assert_rank(tokens_BL, 2)
        if mask_BL is None:
            mask_BL = tokens_BL != self.cfg.pad_token_id
        out = self.backbone.forward(tokens_BL, mask_BL=mask_BL, return_hidden=True, return_logits=False)
        t_B = last_token_index(tokens_BL, self.cfg.pad_token_id)
        h_BD = jnp.take_along_axis(out.hidden, t_B[:, None, None], axis=1)[:, 0, :]
        w_D1 = self.score[...].astype(h_BD.dtype)
        r_B = jnp.einsum("BD,DO->BO", h_BD, w_D1, preferred_element_type=jnp.float32)[:, 0]
        return r_B, h_BD


def save_reward_model(model: RewardModel, path: str | os.PathLike, tokenizer=None, *,
                      overwrite: bool = False) -> Path:
    """Writes an RM checkpoint directory (model_config.json, reward_model.json, params/, tokenizer/)."""
    params = nnx.state(model, nnx.Param).to_pure_dict()
    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        config_json = json.dumps(model_io.config_to_json(model.cfg), indent=2)
        (tmp / model_io.CONFIG_FILE).write_text(config_json + "\n")
        write_marker(tmp)
        with ocp.StandardCheckpointer() as ckpt:
            ckpt.save(tmp / model_io.PARAMS_ITEM, params)
            ckpt.wait_until_finished()
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp / model_io.TOKENIZER_DIR))
    return Path(path)


def write_marker(directory: Path) -> None:
    (Path(directory) / RM_MARKER).write_text(json.dumps({"kind": "reward_model", "head": "score"}) + "\n")


def load_reward_model(path: str | os.PathLike):
    """(RewardModel, tokenizer or None) from an RM checkpoint, a train-rm run directory or one of its
    steps."""
    config_dir, params_dir = model_io.resolve_checkpoint(path)
    if not (config_dir / RM_MARKER).is_file():
        raise CheckpointError(f"{path} is not a reward-model checkpoint (no {RM_MARKER} in {config_dir}); "
                              "train one with `jaxrl train-rm` or import one with jaxrl.reward_model.export")
    cfg = model_io.load_config(config_dir)
    params = model_io.restore_params(params_dir, RewardModel.abstract(cfg),
                                     f"reward-model parameters from {params_dir}")
    return RewardModel.from_params(cfg, params), model_io.load_tokenizer(config_dir)
