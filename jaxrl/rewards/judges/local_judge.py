"""Text judges for model-based rewards: a local causal LM decoded greedily, or a user text generator.

A judge spec is a mapping from a reward's `params` (the OpenRS `pairwise` judge, the Proxy-GRM proxy):

* `{model: PATH, max_new_tokens: 256, batch_size: 8, dtype: null, chat: true}`: a local causal LM (a jaxrl
  checkpoint or run directory, or an HF safetensors directory: `jaxrl.io.model_io.load_model`; `~` is expanded)
  with its saved tokenizer. Requests are encoded (through the tokenizer's chat template as one user message
  when `chat`), decoded greedily (temperature 0, as the references' judges) with the jitted KV-cache sampler
  `jaxrl.sampling.generate_from_state`, `batch_size` rows per call (a short last batch is padded with copies
  of its first row, so one program is compiled per prompt-length bucket). The model is loaded once per
  (path, dtype). A request that does not fit the model's context with `max_new_tokens` gets None.
* `{generate: "module:function"}`: `function(requests: list[str]) -> list[str | None]`, one reply per request
  (None: no reply), e.g. a client of an inference server.

`text_generator(spec)` returns `requests -> replies` for either form; `check_judge_spec` validates a spec
cheaply (no model loading) for `jaxrl.rewards.resolve`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from jaxrl.errors import CheckpointError
from jaxrl.rewards.imports import import_function

Generator = Callable[[Sequence[str]], Sequence[str | None]]

_MODEL_KEYS = {"model": None, "max_new_tokens": 256, "batch_size": 8, "dtype": None, "chat": True}


class _Judge(NamedTuple):
    graphdef: Any
    state: Any
    tokenizer: Any
    eos_ids: tuple[int, ...]
    pad_id: int
    context: int


def check_judge_spec(spec: Any, where: str) -> None:
    """Raises ValueError("<where>...: <what is allowed>") for a bad judge spec (see the module docstring)."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}={spec!r}: must be a mapping {{model: PATH, ...}} or {{generate: "
                         "'module:function'}}")
    if ("model" in spec) == ("generate" in spec):
        raise ValueError(f"{where}: give exactly one of model (a local checkpoint) and generate "
                         "('module:function')")
    if "generate" in spec:
        extra = sorted(set(spec) - {"generate"})
        if extra:
            raise ValueError(f"{where}.{extra[0]}: not used with generate (only model takes settings)")
        import_function(spec["generate"], f"{where}.generate")
        return
    unknown = sorted(set(spec) - set(_MODEL_KEYS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(_MODEL_KEYS)}")
    if not Path(str(spec["model"])).expanduser().exists():
        raise ValueError(f"{where}.model={spec['model']!r}: does not exist (a jaxrl checkpoint, run "
                         "directory or HF directory)")
    for key in ("max_new_tokens", "batch_size"):
        value = spec.get(key, _MODEL_KEYS[key])
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}.{key}={value!r}: must be an integer >= 1")
    if spec.get("dtype") not in (None, "float32", "bfloat16"):
        raise ValueError(f"{where}.dtype={spec['dtype']!r}: allowed values are null, 'float32', 'bfloat16'")


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str | None) -> _Judge:
    """The split model, tokenizer, stop ids, pad id and context length of a judge checkpoint."""
    from flax import nnx

    from jaxrl.io.model_io import load_model

    model, tokenizer = load_model(path, dtype=dtype)
    if tokenizer is None:
        raise CheckpointError(f"{path}: no tokenizer saved with the judge model")
    eos = set(model.cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    graphdef, state = nnx.split(model)
    return _Judge(graphdef, state, tokenizer, tuple(sorted(eos)), int(pad),
                  int(model.cfg.max_position_embeddings))


def _encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def generate_texts(requests: Sequence[str], *, model: str, max_new_tokens: int = 256, batch_size: int = 8,
                   dtype: str | None = None, chat: bool = True) -> list[str | None]:
    """Greedy replies of a local judge model, `batch_size` requests per sampler call (module docstring)."""
    from jaxrl.sampling import generate_from_state

    judge = _load(str(Path(str(model)).expanduser()), dtype)
    ids = [_encode(judge.tokenizer, r, chat) for r in requests]
    fits = [i for i, s in enumerate(ids) if s and len(s) + max_new_tokens <= judge.context]
    out: list[str | None] = [None] * len(ids)
    for start in range(0, len(fits), batch_size):
        rows = fits[start:start + batch_size]
        batch = [ids[i] for i in rows]
        batch += [batch[0]] * (batch_size - len(batch))
        gen = generate_from_state(judge.graphdef, judge.state, batch, max_new_tokens=max_new_tokens,
                                  num_samples=1, temperature=0.0, eos_ids=judge.eos_ids, pad_id=judge.pad_id)
        tokens, lengths = np.asarray(gen.tokens), np.asarray(gen.lengths)
        for r, i in enumerate(rows):
            out[i] = judge.tokenizer.decode(tokens[r, :lengths[r]].tolist(), skip_special_tokens=True)
    return out


def text_generator(spec: Mapping[str, Any]) -> Generator:
    """`requests -> replies` for a judge spec: the user's `generate` function or `generate_texts` bound."""
    if "generate" in spec:
        return import_function(spec["generate"], "judge.generate")
    return functools.partial(generate_texts, **{k: spec.get(k, d) for k, d in _MODEL_KEYS.items()})
