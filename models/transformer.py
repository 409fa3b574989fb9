"""`Transformer`: decoder-only LM (Llama / Qwen2 / Qwen3) with pre-, post- or SiameseNorm blocks.

Layers are stacked: every per-layer parameter has a leading `Y` axis (built with `nnx.vmap`) and the blocks
run under one `jax.lax.scan` over `nnx.split` state, so compile time does not grow with depth. With
`cfg.scan_layers=False` the same block body is unrolled over static slices of the stacks instead (same
parameters, same results): XLA then needs no stacked per-layer residual buffers for the backward pass,
which made a training step of a 4-layer model 10-17% faster on a 2-core CPU (benchmarks/RESULTS.md), at a
compile time that grows with depth.

Choices and deviations from HF `LlamaForCausalLM`:
* Pre-norm (default, HF): x ← x + Attn(N₁(x)); x ← x + MLP(N₂(x)); hidden = N(x).
* Post-norm (Vaswani et al. 2017, arXiv:1706.03762): x ← N₁(x + Attn(x)); x ← N₂(x + MLP(x)), with the
  final norm N kept (hidden = N(x)) so every variant feeds the head through the same `norm`. N₁, N₂ are named
  `post_attention_layernorm`, `post_feedforward_layernorm`.
* SiameseNorm, "post-pre" (`norm="siamese"`) or "hybrid-pre" (`norm="siamese_hybrid"`):
  `jaxrl.models.siamese` (two streams carried through the scan; final `norm(norm_x(x) + norm_y(y))`).
* Logits are always float32 (the head einsum accumulates in float32), whatever the compute dtype.
* Positions default to `(#valid cache slots) + cumsum(mask) − 1`, clipped at 0, so left padding, prefill and
  decode all get HF's positions without the caller passing them (an explicit `positions_BL` wins).
* Attention visibility is by cache *slot*, not by position: a query sees valid slots ≤ its own slot.
* Packed rows (`segment_BL`, `jaxrl.rl.packing`): several sequences in one row, each seeing only itself, with
  positions restarting per segment (the update computes no padding).
* Unpadded rows (`segment_BL` + `row_map`, `jaxrl.models.unpadded`): the real tokens of padded rows end to end,
  attention run on rows of those sequences sorted into classes by length; the per-token layers compute no
  padding even where rows cannot share one.
* `forward_groups` (training / scoring of GRPO groups): each prompt runs once for the G completions that share
  it, through the same layer loop (`jaxrl.models.shared_prompt`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.models import shared_prompt, siamese, unpadded
from jaxrl.models.attention import ATTENTION_CORE_NAMES, KeyMask
from jaxrl.models.config import TransformerConfig
from jaxrl.models.kv_cache import KVCache, write_slots
from jaxrl.models.layers import MLP, Attention, Embed, Proj, RMSNorm, rope_inv_freq, rope_tables
from jaxrl.sharding import Constrain, no_constraint

_ACT_BLD = ("batch", "length", "embed")
_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "attention": jax.checkpoint_policies.save_only_these_names(*ATTENTION_CORE_NAMES),
}


class ModelOutput(NamedTuple):
    logits: Optional[jax.Array]  # [B, L, V] float32
    hidden: Optional[jax.Array]  # [B, L, D] final normed hidden state (the LM-head input)
    cache: Optional[KVCache]


class Block(nnx.Module):
    """One transformer block: attention then MLP; `norm` in {"pre", "post", "siamese", "siamese_hybrid"}."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, head_dim: int, mlp_dim: int, *, norm: str,
                 qkv_bias: bool, qk_norm: bool, eps: float, rngs: nnx.Rngs, dtype, param_dtype):
        self.norm = norm
        self.self_attn = Attention(dim, num_heads, num_kv_heads, head_dim, qkv_bias=qkv_bias, qk_norm=qk_norm,
                                   eps=eps, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.mlp = MLP(dim, mlp_dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        if norm == "pre":
            self.input_layernorm = RMSNorm(dim, eps=eps, param_dtype=param_dtype)
            self.post_attention_layernorm = RMSNorm(dim, eps=eps, param_dtype=param_dtype)
        elif norm == "post":
            self.post_attention_layernorm = RMSNorm(dim, eps=eps, param_dtype=param_dtype)
            self.post_feedforward_layernorm = RMSNorm(dim, eps=eps, param_dtype=param_dtype)
        elif norm == "siamese":
            self.siamese = siamese.SiameseNorms(dim, eps=eps, param_dtype=param_dtype)
        else:
            self.siamese = siamese.HybridNorms(dim, eps=eps, param_dtype=param_dtype)

    def __call__(self, carry, layer, cos_BLH, sin_BLH, visible, cache_kv, keep_mlp_projections: bool = True):
        """carry: x [B, L, D] (or (x, y) for siamese) → (new carry, (k_BKLH, v_BKLH)); without
        `keep_mlp_projections` the backward recomputes the MLP's projections (`MLP.__call__`)."""
        new_kv = []
        mlp = functools.partial(self.mlp, keep_projections=keep_mlp_projections)

        def attn(u_BLD, norm=None):
            out_BLD, kv = self.self_attn(u_BLD, cos_BLH, sin_BLH, visible, cache_kv, norm=norm)
            new_kv.append(kv)
            return out_BLD

        if self.norm == "pre":  # each norm runs inside its sublayer's checkpoint (recomputed, not kept)
            x = carry + attn(carry, norm=self.input_layernorm)
            carry = x + mlp(x, norm=self.post_attention_layernorm)
        elif self.norm == "post":
            x = self.post_attention_layernorm(carry + attn(carry))
            carry = self.post_feedforward_layernorm(x + mlp(x))
        elif self.norm == "siamese":
            scale = siamese.depth_scale(layer)
            x, y = self.siamese.apply("attn", *carry, attn, scale)
            carry = self.siamese.apply("mlp", x, y, mlp, scale)
        else:
            scale = siamese.depth_scale(layer)
            x, y = self.siamese.attention(*carry, attn, scale)
            carry = self.siamese.mlp(x, y, mlp, scale)
        return carry, new_kv[0]


class Transformer(nnx.Module):
    """Causal LM. See docs/DESIGN.md ("Model contract") for `forward`, `__call__` and `unembedding`."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs, constrain: Constrain = no_constraint):
        self.cfg = cfg
        self.constrain = constrain
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        eps = cfg.rms_norm_eps
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype,
                                  param_dtype=param_dtype)

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make_blocks(layer_rngs: nnx.Rngs) -> Block:
            return Block(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim,
                         norm=cfg.norm, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm, eps=eps, rngs=layer_rngs,
                         dtype=dtype, param_dtype=param_dtype)

        self.layers = make_blocks(rngs)
        self.norm = RMSNorm(cfg.hidden_size, eps=eps, param_dtype=param_dtype)
        if cfg.two_stream:
            self.norm_x = RMSNorm(cfg.hidden_size, eps=eps, param_dtype=param_dtype)
            self.norm_y = RMSNorm(cfg.hidden_size, eps=eps, param_dtype=param_dtype)
        if not cfg.tie_embeddings:
            self.lm_head = Proj((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), "BLD,DV->BLV",
                                num_in=1, bias=False, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    # ------------------------------------------------------------------ construction helpers

    @classmethod
    def abstract(cls, cfg: TransformerConfig, *, constrain: Constrain = no_constraint) -> "Transformer":
        """A model whose parameters are `jax.ShapeDtypeStruct`s: no random weights are allocated."""
        return nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0), constrain=constrain))

    @classmethod
    def from_params(cls, cfg: TransformerConfig, params: dict, *,
                    constrain: Constrain = no_constraint) -> "Transformer":
        """A model holding `params` (the nested dict of `hf_io.hf_to_params`), built without random init."""
        model = cls.abstract(cfg, constrain=constrain)
        set_params(model, params)
        return model

    # ------------------------------------------------------------------ forward

    def unembedding(self) -> jax.Array:
        """The [D, V] head matrix in the compute dtype (tied: embedding transposed)."""
        dtype = jnp.dtype(self.cfg.dtype)
        if self.cfg.tie_embeddings:
            return self.embed_tokens.embedding[...].T.astype(dtype)
        return self.lm_head.kernel[...].astype(dtype)

    def __call__(self, tokens_BL: jax.Array) -> jax.Array:
        """Causal LM logits [B, L, V] (float32) of unpadded tokens."""
        return self.forward(tokens_BL).logits

    def forward(self, tokens_BL, positions_BL=None, mask_BL=None, *, cache: Optional[KVCache] = None,
                layers: Optional[tuple] = None, return_hidden: bool = False,
                return_logits: bool = True, segment_BL=None, row_map=None) -> ModelOutput:
        """Runs the L new tokens, optionally appending their keys to `cache` (slots [index, index + L)).

        Args:
          tokens_BL: [B, L] int token ids.
          positions_BL: [B, L] int RoPE positions, or None (see the module docstring).
          mask_BL: [B, L] bool/int, 1 = real token (padding is never attended as a key), or None (all real).
          cache: None for a full-sequence forward, or a `KVCache` with B rows and room for L more slots
            (`index + L <= capacity` is the caller's duty: under jit the index is traced, and XLA would clamp
            an out-of-range write onto the last slots).
          layers: None, or `self.layer_states()` (taken once, outside a decode loop): the blocks then run
            unrolled on those per-layer weights, reading each in place. A per-layer cache (`KVCache.unstack`)
            implies this (the states are then taken here).
          return_hidden, return_logits: which of `hidden` [B, L, D] / `logits` [B, L, V] to compute.
          segment_BL: None, or [B, L] int segment ids of packed rows (`jaxrl.rl.packing`, no cache): a query sees
            only the keys of its own segment, and default positions restart at 0 in each segment, so every
            segment computes what it would alone in a row of its own.
          row_map: None, or (rows, slots) of unpadded rows (`jaxrl.models.unpadded.Unpadded`, with
            `segment_BL`, no cache): this call's rows hold the real tokens of padded rows end to end, one
            segment per padded row, and attention runs on classes of rows of those sequences (per class c,
            `rows[c]` [A_c, L_c]: each slot's position here, −1 at padding; `slots[c]` [B, L], this call's
            shape: each position's slot in class c, −1 elsewhere).

        Returns:
          ModelOutput(logits, hidden, cache) — cache is the updated cache (index += L), or None.
        """
        chex.assert_rank(tokens_BL, 2)
        chex.assert_type(tokens_BL, int)
        batch, length = tokens_BL.shape
        mask_BL = jnp.ones((batch, length), bool) if mask_BL is None else jnp.asarray(mask_BL).astype(bool)
        chex.assert_shape(mask_BL, (batch, length))
        if cache is not None and (cache.batch != batch or length > cache.capacity):
            raise ValueError(f"forward of tokens {tokens_BL.shape} does not fit a cache of "
                             f"{cache.batch} rows x {cache.capacity} slots")
        visible, valid_BS, prior_B = _visibility(mask_BL, cache, self.cfg.attention)
        if segment_BL is not None:
            if cache is not None:
                raise ValueError("packed rows (segment_BL) are a full-sequence forward: no KV cache")
            visible, segment_positions_BL = _segmented(visible, mask_BL, segment_BL)
            positions_BL = segment_positions_BL if positions_BL is None else positions_BL
            if row_map is not None:  # attention on rows of each sequence instead of within segments
                visible = unpadded.unpadded_visibility(*row_map, kernel=self.cfg.attention)
        elif row_map is not None:
            raise ValueError("unpadded rows (row_map) need their segment ids (segment_BL)")
        elif positions_BL is None:
            counts_BL = prior_B[:, None] + jnp.cumsum(mask_BL, axis=-1, dtype=jnp.int32)
            positions_BL = jnp.maximum(counts_BL - 1, 0)
        chex.assert_shape(positions_BL, (batch, length))
        hidden_BLD, new_kv = self._hidden(tokens_BL, positions_BL, visible, cache, layers)

        logits_BLV = None
        if return_logits:
            logits_BLV = jnp.einsum("BLD,DV->BLV", hidden_BLD, self.unembedding(),
                                    preferred_element_type=jnp.float32)
        new_cache = None
        if cache is not None:
            new_cache = cache.append(*new_kv, valid_BS, length)
        return ModelOutput(logits_BLV, hidden_BLD if return_hidden else None, new_cache)

    def forward_groups(self, prompt_PW, prompt_mask_PW, completion_BT, completion_mask_BT) -> jax.Array:
        """[B, T, D] final hidden states predicting each completion token, each prompt run once for the
        G = B / P completions of its group (rows of a group consecutive): `jaxrl.models.shared_prompt`.

        Args:
          prompt_PW, prompt_mask_PW: [P, W] left-padded prompts and their real tokens (W >= 1).
          completion_BT, completion_mask_BT: [B, T] completions and their real tokens.

        Returns:
          hidden_BTD, equal to `forward(...).hidden[:, W - 1:W + T - 1]` of the rows [prompt | completion].
        """
        tokens_PS, positions_PS, visible = shared_prompt.layout(prompt_PW, prompt_mask_PW, completion_BT,
                                                                completion_mask_BT, kernel=self.cfg.attention)
        hidden_PSD, _ = self._hidden(tokens_PS, positions_PS, visible)
        group = completion_BT.shape[0] // prompt_PW.shape[0]
        return shared_prompt.prediction_hidden(hidden_PSD, prompt_PW.shape[1], group)

    def _hidden(self, tokens_BL, positions_BL, visible, cache=None, layers=None):
        """(final normed hidden [B, L, D], new keys/values): embedding, the layer loop, the final norm."""
        cfg = self.cfg
        cos_BLH, sin_BLH = rope_tables(positions_BL, rope_inv_freq(cfg.head_dim, cfg.rope_theta,
                                                                   cfg.rope_scaling), jnp.dtype(cfg.dtype))
        x_BLD = self.constrain(self.embed_tokens(tokens_BL), _ACT_BLD)
        carry = (x_BLD, x_BLD) if cfg.two_stream else x_BLD
        carry, new_kv = self._run_layers(carry, cos_BLH, sin_BLH, visible, cache, layers)
        if cfg.two_stream:
            hidden_BLD = siamese.siamese_merge(*carry, norm_x=self.norm_x, norm_y=self.norm_y, norm=self.norm)
        else:
            hidden_BLD = self.norm(carry)
        return self.constrain(hidden_BLD, _ACT_BLD), new_kv

    def layer_states(self) -> tuple[nnx.State, ...]:
        """The stacked block parameters as Y per-layer states, for `forward(layers=...)`.

        Under jit this materialises one more copy of the block weights, which pays off in a decode loop on
        XLA:CPU: there a layer scan copies every weight slice out of its `[Y, ...]` stack at every step (the
        dynamic-slice is not fused into the dot), while per-layer buffers are read in place. Measured on a
        2-core CPU at batch 16: a Qwen3-0.6B-shaped decode step 237 -> 150 ms (benchmarks/RESULTS.md).
        """
        _, state = nnx.split(self.layers)
        return tuple(jax.tree.map(lambda a, i=i: a[i], state) for i in range(self.cfg.num_layers))

    def _run_layers(self, carry, cos_BLH, sin_BLH, visible, cache, layers=None):
        graphdef, state = nnx.split(self.layers)
        constrain = self.constrain

        def body(carry, xs):
            layer_state, layer, kv = xs
            block = nnx.merge(graphdef, layer_state)
            carry, new_kv = block(carry, layer, cos_BLH, sin_BLH, visible, kv,
                                  keep_mlp_projections=self.cfg.remat != "mlp")
            carry = jax.tree.map(lambda a: constrain(a, _ACT_BLD), carry)
            return carry, (new_kv if kv is not None else None)

        if self.cfg.remat in _REMAT_POLICIES:  # "mlp": only the MLP's own checkpoint changes (`Block`)
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[self.cfg.remat])
        if layers is None and (not self.cfg.scan_layers or (cache is not None and cache.per_layer)):
            layers = self.layer_states()  # static slices of the stacks
        if layers is not None:  # unrolled: the same body per layer on per-layer weights (and cache buffers)
            new_kvs = []
            for i, layer_state in enumerate(layers):
                carry, new_kv = body(carry, (layer_state, i, None if cache is None else cache.layer(i)))
                new_kvs.append(new_kv)
            return carry, (None if cache is None else tuple(zip(*new_kvs)))
        kv = None if cache is None else (cache.k, cache.v)
        return jax.lax.scan(body, carry, (state, jnp.arange(self.cfg.num_layers, dtype=jnp.int32), kv))


def _visibility(mask_BL, cache, kernel: str = "xla"):
    """(visible, valid_BS after this call, #valid slots before this call per row).

    `visible` is a causal `KeyMask` over the row's real tokens without a cache (no [B, L, L] tensor; `kernel`
    picks the attention kernel); with one, the pair ([B, L, S] visible old slots — valid and before `index`
    — , [B, L, L] visible new keys), matching `Attention`'s separate old/new scores.
    """
    batch, length = mask_BL.shape
    if cache is None:
        return KeyMask(mask_BL, kernel=kernel), None, jnp.zeros((batch,), jnp.int32)
    prior_B = jnp.sum(cache.valid_BS, axis=-1, dtype=jnp.int32)
    valid_BS = write_slots(cache.valid_BS, mask_BL, cache.index, row_axis=0, slot_axis=1)
    index_B1 = jnp.reshape(cache.index, (-1, 1))  # [1, 1] shared, or [B, 1] per row (`KVCache.with_row_index`)
    old_BS = cache.valid_BS & (jnp.arange(cache.capacity)[None, :] < index_B1)
    causal_LL = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    visible_old_BLS = jnp.broadcast_to(old_BS[:, None, :], (batch, length, cache.capacity))
    return (visible_old_BLS, mask_BL[:, None, :] & causal_LL[None]), valid_BS, prior_B


def _segmented(visible: KeyMask, mask_BL, segment_BL):
    """(visibility, positions) of packed rows: keys of the query's own segment only; positions counted from
    the segment's first real token,

        pos[b, i] = #real tokens in row b up to i  −  #real tokens before the segment of i  −  1.
    """
    chex.assert_shape(segment_BL, mask_BL.shape)
    counts_BL = jnp.cumsum(mask_BL, axis=-1, dtype=jnp.int32)
    starts_BL = jnp.concatenate([jnp.ones_like(segment_BL[:, :1], bool),
                                 segment_BL[:, 1:] != segment_BL[:, :-1]], axis=-1)
    # counts are non-decreasing along a row, so the running max of (count before the segment) at segment
    # starts is the count before the current segment
    before_BL = jax.lax.cummax(jnp.where(starts_BL, counts_BL - mask_BL.astype(jnp.int32), 0), axis=1)
    packed = visible.replace(query_segment_BL=segment_BL, key_segment_BS=segment_BL)
    return packed, jnp.maximum(counts_BL - before_BL - 1, 0)


def set_params(model: Transformer, params: dict) -> None:
    """Writes a nested dict of arrays (layout of `nnx.state(model, nnx.Param).to_pure_dict()`) into `model`.

    Works on an abstract model (`Transformer.abstract`). Every parameter must be present with its exact shape;
    values are cast to `cfg.param_dtype`. Raises KeyError / ValueError naming the parameter path.
    """
    expected = nnx.state(model, nnx.Param).to_pure_dict()
    dtype = jnp.dtype(model.cfg.param_dtype)
    flat_expected = dict(_flatten(expected))
    flat_given = dict(_flatten(params))
    missing = sorted(set(flat_expected) - set(flat_given))
    extra = sorted(set(flat_given) - set(flat_expected))
    if missing:
        raise KeyError(f"params lack {['/'.join(p) for p in missing]}")
    if extra:
        raise KeyError(f"params have unexpected entries {['/'.join(p) for p in extra]}")
    values = {}
    for path, want in flat_expected.items():
        got = flat_given[path]
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(
                f"param {'/'.join(path)}: expected shape {tuple(want.shape)}, found {tuple(got.shape)}"
            )
        values[path] = jnp.asarray(got, dtype=dtype)
    state = nnx.state(model, nnx.Param)
    state.replace_by_pure_dict(_unflatten(values))
    nnx.update(model, state)


def _flatten(tree, prefix=()):
    if isinstance(tree, dict):
        for key, sub in tree.items():
            yield from _flatten(sub, prefix + (str(key),))
    else:
        yield prefix, tree


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out
