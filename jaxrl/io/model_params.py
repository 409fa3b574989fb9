"""A model from a parameter dict, and the token ids a saved model config records (shared by `jaxrl.io.model_io`
and `jaxrl.io.hf`, which import this module and never each other at load time)."""

from __future__ import annotations

from typing import Any

from jaxrl.errors import CheckpointError
from jaxrl.models import Transformer, TransformerConfig


def model_from_params(cfg: TransformerConfig, params: dict, *, where: str) -> Transformer:
    """A Transformer holding `params` (pure dict of `nnx.state(model, nnx.Param)`), cast to cfg.param_dtype.

    A missing / unexpected parameter or a wrong shape is a CheckpointError naming the parameter and `where`.
    """
    try:
        return Transformer.from_params(cfg, params)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{where}: {e.args[0] if e.args else e}") from e



def token_ids(tokenizer, config_eos: Any = None) -> dict[str, Any]:
    """bos/eos/pad ids for a saved config, from the tokenizer actually used (None where it has none).

    A preset's defaults may name other tokens (the `tiny` preset says eos=2, the built-in tokenizer's end
    token is 1, so transformers' `generate` ran past it). The tokenizer's eos comes first; a multi-id
    `config_eos` (e.g. Llama 3's end-of-turn and end-of-text) keeps its other ids after it.
    """
    def tid(name):
        value = getattr(tokenizer, f"{name}_token_id", None)
        return None if value is None else int(value)

    eos = tid("eos")
    if isinstance(config_eos, (list, tuple)) and len(config_eos) > 1 and eos is not None:
        eos = (eos, *(int(i) for i in config_eos if int(i) != eos))
    elif eos is None:
        eos = config_eos
    return {"bos_token_id": tid("bos"), "eos_token_id": eos, "pad_token_id": tid("pad")}
