"""Hugging Face <-> jaxrl: config translation and the tensor name/layout table. numpy only, no torch.

`hf_to_params(cfg, get_tensor)` builds the nested dict of `nnx.state(model, nnx.Param).to_pure_dict()`;
`params_to_hf(cfg, params)` yields `(hf_name, array)` pairs in torch layout (Linear weights `[out, in]`).

Layouts: HF `q_proj.weight` `[N·H, D]` <-> ours `q_proj.kernel` `[D, N, H]`; `o_proj.weight` `[D, N·H]` <->
`[N, H, D]`; `gate/up_proj.weight` `[F, D]` <-> `[D, F]`; `down_proj.weight` `[D, F]` <-> `[F, D]`;
`lm_head.weight` `[V, D]` <-> `[D, V]`; biases `[N·H]` <-> `[N, H]`; embeddings and norm weights unchanged.
Per-layer tensors `model.layers.{i}.*` are stacked on a leading `[Y]` axis. Tied embeddings have no `lm_head`.

Names beyond the standard Llama/Qwen ones (post-norm and SiameseNorm models, exported with our modeling file):
* post-norm: `model.layers.{i}.post_attention_layernorm.weight` (x = N(x + Attn(x))) and
  `model.layers.{i}.post_feedforward_layernorm.weight` (x = N(x + MLP(x))); no `input_layernorm`.
* SiameseNorm: `model.layers.{i}.siamese.{attn,mlp}_{post,pre,in}_norm.weight` (six per layer, no
  input/post-attention layernorm), and `model.norm_x.weight`, `model.norm_y.weight` next to
  `model.norm.weight`.
* SiameseNorm hybrid-pre: `model.layers.{i}.siamese.<name>.weight` for the five names `attn_norm`,
  `attn_y_norm`, `mlp_norm`, `mlp_y_norm`, `mlp_in_norm`, and the same three model-level norms.
Which names a config uses follows from its abstract parameter tree: table rows whose parameter does not exist
for that config are skipped.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from flax import nnx

from jaxrl.models.config import Llama3RopeScaling, TransformerConfig
from jaxrl.models.siamese import HYBRID_NORM_NAMES

# (HF name, our path, num_in): num_in = number of leading *input* axes of our kernel for a Linear weight
# (HF stores [out, in], we store [in..., out...]); None = same data, only reshaped (bias, norm, embedding).
_GLOBAL = (
    ("model.embed_tokens.weight", "embed_tokens/embedding", None),
    ("model.norm.weight", "norm/weight", None),
    ("model.norm_x.weight", "norm_x/weight", None),
    ("model.norm_y.weight", "norm_y/weight", None),
    ("lm_head.weight", "lm_head/kernel", 1),
)
_LAYER = (  # under "model.layers.{i}." / "layers/"
    ("self_attn.q_proj.weight", "self_attn/q_proj/kernel", 1),
    ("self_attn.k_proj.weight", "self_attn/k_proj/kernel", 1),
    ("self_attn.v_proj.weight", "self_attn/v_proj/kernel", 1),
    ("self_attn.o_proj.weight", "self_attn/o_proj/kernel", 2),
    ("self_attn.q_proj.bias", "self_attn/q_proj/bias", None),
    ("self_attn.k_proj.bias", "self_attn/k_proj/bias", None),
    ("self_attn.v_proj.bias", "self_attn/v_proj/bias", None),
    ("self_attn.q_norm.weight", "self_attn/q_norm/weight", None),
    ("self_attn.k_norm.weight", "self_attn/k_norm/weight", None),
    ("mlp.gate_proj.weight", "mlp/gate_proj/kernel", 1),
    ("mlp.up_proj.weight", "mlp/up_proj/kernel", 1),
    ("mlp.down_proj.weight", "mlp/down_proj/kernel", 1),
    ("input_layernorm.weight", "input_layernorm/weight", None),
    ("post_attention_layernorm.weight", "post_attention_layernorm/weight", None),
    ("post_feedforward_layernorm.weight", "post_feedforward_layernorm/weight", None),
) + tuple(
    (f"siamese.{s}_{r}_norm.weight", f"siamese/{s}_{r}_norm/weight", None)
    for s in ("attn", "mlp") for r in ("post", "pre", "in")
) + tuple(
    (f"siamese.{name}.weight", f"siamese/{name}/weight", None) for name in HYBRID_NORM_NAMES
)

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_REMOTE_ARCHITECTURE = "JaxrlForCausalLM"  # our trust_remote_code export (jaxrl/remote_code), any norm


# ---------------------------------------------------------------------------------------------- tensors

def _our_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined parameter path -> shape, from the abstract model (nothing allocated)."""
    from jaxrl.models.transformer import Transformer  # local: transformer imports nothing from here

    tree = nnx.state(Transformer.abstract(cfg), nnx.Param).to_pure_dict()
    out = {}

    def walk(node, prefix):
        for key, sub in node.items():
            path = f"{prefix}/{key}" if prefix else str(key)
            if isinstance(sub, Mapping):
                walk(sub, path)
            else:
                out[path] = tuple(sub.shape)

    walk(tree, "")
    return out


def _rows(cfg: TransformerConfig):
    """(hf_name, our_path, num_in, layer or None, our per-tensor shape) for every tensor `cfg` uses."""
    shapes = _our_shapes(cfg)
    covered = set()
    for hf, ours, num_in in _GLOBAL:
        if ours in shapes:
            covered.add(ours)
            yield hf, ours, num_in, None, shapes[ours]
    for hf, ours, num_in in _LAYER:
        path = f"layers/{ours}"
        if path in shapes:
            covered.add(path)
            for i in range(cfg.num_layers):
                yield f"model.layers.{i}.{hf}", path, num_in, i, shapes[path][1:]
    if set(shapes) - covered:  # a model parameter the table does not know: a bug in this file
        raise AssertionError(f"hf_io table misses parameters {sorted(set(shapes) - covered)}")


def hf_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name `cfg` needs -> its HF (torch layout) shape. Abstract: allocates nothing."""
    return {hf: _hf_layout(shape, num_in, hf) for hf, _, num_in, _, shape in _rows(cfg)}


def _hf_layout(shape: tuple[int, ...], num_in, hf_name: str) -> tuple[int, ...]:
    if num_in is not None:
        return (math.prod(shape[num_in:]), math.prod(shape[:num_in]))
    if hf_name.endswith(".bias"):
        return (math.prod(shape),)
    return shape


def _to_ours(tensor: np.ndarray, shape, num_in) -> np.ndarray:
    if num_in is None:
        return tensor.reshape(shape)
    return tensor.T.reshape(shape)


def _to_hf(value, hf_shape, num_in):
    if num_in is None:
        return value.reshape(hf_shape)
    return value.reshape(math.prod(value.shape[:num_in]), -1).T


def hf_to_params(cfg: TransformerConfig, get_tensor: Callable[[str], Any]) -> dict:
    """Nested dict of numpy arrays (dtype `cfg.param_dtype`) from HF tensors fetched one at a time.

    Args:
      cfg: the model config (decides which tensors are needed).
      get_tensor: `name -> array` in HF layout (numpy or anything `np.asarray` takes); may raise KeyError.

    Raises:
      KeyError naming a missing tensor; ValueError naming a tensor with the wrong shape (expected vs found).
    """
    dtype = np.dtype(_np_dtype(cfg.param_dtype))
    flat: dict[str, np.ndarray] = {}
    for hf, ours, num_in, layer, shape in _rows(cfg):
        try:
            tensor = np.asarray(get_tensor(hf))
        except KeyError as e:
            raise KeyError(f"checkpoint has no tensor {hf!r} (needed for parameter {ours})") from e
        want = _hf_layout(shape, num_in, hf)
        if tuple(tensor.shape) != want:
            raise ValueError(f"tensor {hf!r}: expected shape {want}, found {tuple(tensor.shape)}")
        value = _to_ours(tensor, shape, num_in).astype(dtype)
        if layer is None:
            flat[ours] = value
        else:
            if ours not in flat:
                flat[ours] = np.empty((cfg.num_layers,) + tuple(shape), dtype)
            flat[ours][layer] = value
    return _nest(flat)


def params_to_hf(cfg: TransformerConfig, params: Mapping) -> Iterator[tuple[str, np.ndarray]]:
    """Yields `(hf_name, numpy array)` in torch layout, one tensor at a time, in table order.

    `params` is the nested dict of `nnx.state(model, nnx.Param).to_pure_dict()` (numpy or jax arrays; one
    layer slice is copied to host at a time). Use `dict(params_to_hf(...))` for a mapping and `hf_shapes(cfg)`
    for shapes.
    """
    for hf, ours, num_in, layer, shape in _rows(cfg):
        node = params
        for key in ours.split("/"):
            if key not in node:
                raise KeyError(f"params lack {ours!r} (for HF tensor {hf!r})")
            node = node[key]
        value = node if layer is None else node[layer]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"param {ours}: expected shape {tuple(shape)} per tensor, found {tuple(value.shape)}"
            )
        yield hf, np.ascontiguousarray(_to_hf(np.asarray(value), _hf_layout(shape, num_in, hf), num_in))


def _nest(flat: dict[str, np.ndarray]) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def _np_dtype(name: str):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.float32


# ---------------------------------------------------------------------------------------------- configs

def config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """A `TransformerConfig` from an HF `config.json` dict (Llama / Qwen2 / Qwen3 / our JaxrlForCausalLM).

    Reads transformers-5 `rope_parameters` and legacy top-level `rope_theta` / `rope_scaling`.
    Raises ValueError for an unknown architecture or rope type, naming it and what is supported.
    """
    arch = (hf.get("architectures") or [None])[0]
    supported = sorted(_ARCHITECTURES) + [_REMOTE_ARCHITECTURE]
    if arch == _REMOTE_ARCHITECTURE:
        qkv_bias, qk_norm, norm = bool(hf.get("attention_bias", False)), bool(hf.get("qk_norm", False)), \
            hf.get("norm", "pre")
        family = "qwen3" if qk_norm else "qwen2" if qkv_bias else "llama"
    elif arch in _ARCHITECTURES:
        family, norm = _ARCHITECTURES[arch], "pre"
        qkv_bias = family == "qwen2" or (family == "llama" and bool(hf.get("attention_bias", False)))
        qk_norm = family == "qwen3"
        if family != "qwen2" and hf.get("attention_bias", False):
            raise ValueError(f"{arch} with attention_bias=true (bias on o_proj too) is not supported")
    else:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {supported}")
    heads = int(hf["num_attention_heads"])
    return TransformerConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        mlp_dim=int(hf["intermediate_size"]),
        rope_theta=_rope_theta(hf),
        rope_scaling=_rope_scaling(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        norm=norm,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        family=family,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=_eos(hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"),
    )


def _rope_dict(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    return hf.get("rope_parameters") or hf.get("rope_scaling") or {}


def _rope_theta(hf: Mapping[str, Any]) -> float:
    return float(_rope_dict(hf).get("rope_theta", hf.get("rope_theta", 10000.0)))


def _rope_scaling(hf: Mapping[str, Any]) -> Llama3RopeScaling | None:
    rope = _rope_dict(hf)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"unsupported rope_type {kind!r}; supported: 'default', 'llama3'")
    return Llama3RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )


def _eos(value):
    return tuple(value) if isinstance(value, list) else value


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
    """The HF `config.json` dict of a pre-norm `cfg` (standard architecture of `cfg.family`).

    Post-norm / SiameseNorm configs get the same keys; `jaxrl.io.hf` swaps in our remote-code architecture.
    Raises ValueError when switches cannot be expressed by the family's HF class (e.g. qk_norm on Llama).
    """
    needs = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}[cfg.family]
    if cfg.norm == "pre" and (cfg.qkv_bias, cfg.qk_norm) != needs:
        raise ValueError(
            f"family {cfg.family!r} in transformers has qkv_bias={needs[0]}, qk_norm={needs[1]}; "
            f"config has qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}"
        )
    arch = {family: name for name, family in _ARCHITECTURES.items()}[cfg.family]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                    high_freq_factor=s.high_freq_factor,
                    original_max_position_embeddings=s.original_max_position_embeddings)
    out = {
        "architectures": [arch],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.qkv_bias,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }
    if cfg.family == "llama":
        out["mlp_bias"] = False
    return out
