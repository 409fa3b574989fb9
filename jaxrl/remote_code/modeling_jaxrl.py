"""PyTorch modeling for jaxrl decoder models with post-norm or SiameseNorm (loaded with trust_remote_code).

Written for jaxrl; it mirrors `jaxrl.models` line by line so that `AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)` gives the logits of the JAX model: RMSNorm (computed in float32), RoPE (rotate-half
layout, optional Llama-3 frequency scaling), grouped-query attention with optional q/k/v bias and per-head q/k
RMSNorm (Qwen3), SwiGLU MLP, tied or untied head.

Residual wiring (`config.norm`):
* "pre":  x += Attn(LN_in(x)); x += MLP(LN_pa(x)); h = LN(x).
* "post": x = LN_pa(x + Attn(x)); x = LN_pf(x + MLP(x)); h = LN(x) (final norm kept, as in jaxrl).
* "siamese": SiameseNorm "post-pre" (Li et al., arXiv:2602.08064) with RMSNorm for every norm. Two streams x
  (post) and y (pre), x_0 = y_0 = embed. For block l and F in (Attn, MLP), c_l = sqrt(2 (l + 1)):
      x̄ = LN_post^F(x);  u = LN_in^F(x̄ + LN_pre^F(y));  z = F(u);  x = x̄ + z / c_l;  y = y + z
  and h = LN(LN_x(x) + LN_y(y)).
* "siamese_hybrid": SiameseNorm "hybrid-pre" (the OLMo block of the SiameseNorm repository), same streams, c_l
  and output; per block
      h = LN_a(x) + LN_ay(y);  a = Attn(h);  x = x + a / c_l;  y = y + a       (no norm on the merge)
      x~ = LN_f(x);  m = MLP(LN_fin(x~ + LN_fy(y)));  x = x~ + m / c_l;  y = y + m
  (attention's per-head q/k RMSNorm when `qk_norm`).

Deviations from transformers' Llama: no KV cache (every forward recomputes the whole sequence, so `generate`
works but is O(L^2) per step); eager attention only; with an `attention_mask` and no `position_ids`, positions
are `cumsum(mask) - 1` clipped at 0 (jaxrl's convention, so left-padded rows get the same logits as unpadded).
"""

import math

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_jaxrl import JaxrlDecoderConfig


class JaxrlRMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w; the normalisation in float32, cast back before the weight."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * x32.to(x.dtype)


def _inv_freq(config) -> torch.Tensor:
    rope = config.rope_parameters
    dim = config.head_dim
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rope.get("rope_type", "default") == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_ctx = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv.float()


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class JaxrlAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, n, h = config.hidden_size, config.num_attention_heads, config.head_dim
        k = config.num_key_value_heads
        self.n, self.k, self.h = n, k, h
        self.q_proj = nn.Linear(d, n * h, bias=config.attention_bias)
        self.k_proj = nn.Linear(d, k * h, bias=config.attention_bias)
        self.v_proj = nn.Linear(d, k * h, bias=config.attention_bias)
        self.o_proj = nn.Linear(n * h, d, bias=False)
        if config.qk_norm:
            self.q_norm = JaxrlRMSNorm(h, config.rms_norm_eps)
            self.k_norm = JaxrlRMSNorm(h, config.rms_norm_eps)

    def forward(self, x_BLD, cos_BLH, sin_BLH, bias_BLL):
        b, l, _ = x_BLD.shape
        q = self.q_proj(x_BLD).view(b, l, self.n, self.h)
        k = self.k_proj(x_BLD).view(b, l, self.k, self.h)
        v = self.v_proj(x_BLD).view(b, l, self.k, self.h)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos_BLH[:, :, None, :], sin_BLH[:, :, None, :]
        q = (q * cos + _rotate_half(q) * sin).transpose(1, 2)  # B N L H
        k = (k * cos + _rotate_half(k) * sin).transpose(1, 2)
        v = v.transpose(1, 2)
        rep = self.n // self.k
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(self.h)
        probs = torch.softmax(scores + bias_BLL[:, None], dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, l, self.n * self.h)
        return self.o_proj(out)


class JaxrlMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class JaxrlSiameseNorms(nn.Module):
    """The six per-block SiameseNorm norms `{attn,mlp}_{post,pre,in}_norm` (jaxrl `models/siamese.py`)."""

    def __init__(self, config):
        super().__init__()
        for sub in ("attn", "mlp"):
            for role in ("post", "pre", "in"):
                setattr(self, f"{sub}_{role}_norm", JaxrlRMSNorm(config.hidden_size, config.rms_norm_eps))

    def apply(self, sub: str, x, y, fn, c: float):
        x_bar = getattr(self, f"{sub}_post_norm")(x)
        z = fn(getattr(self, f"{sub}_in_norm")(x_bar + getattr(self, f"{sub}_pre_norm")(y)))
        return x_bar + z / c, y + z


class JaxrlSiameseHybridNorms(nn.Module):
    """The five per-block hybrid-pre norms (jaxrl `models/siamese.py`, `HybridNorms`)."""

    def __init__(self, config):
        super().__init__()
        for name in ("attn_norm", "attn_y_norm", "mlp_norm", "mlp_y_norm", "mlp_in_norm"):
            setattr(self, name, JaxrlRMSNorm(config.hidden_size, config.rms_norm_eps))

    def attention(self, x, y, fn, c: float):
        a = fn(self.attn_norm(x) + self.attn_y_norm(y))
        return x + a / c, y + a

    def mlp(self, x, y, fn, c: float):
        x_tilde = self.mlp_norm(x)
        m = fn(self.mlp_in_norm(x_tilde + self.mlp_y_norm(y)))
        return x_tilde + m / c, y + m


class JaxrlDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.norm_kind = config.norm
        self.c = math.sqrt(2 * (layer_idx + 1))
        self.self_attn = JaxrlAttention(config)
        self.mlp = JaxrlMLP(config)
        d, eps = config.hidden_size, config.rms_norm_eps
        if config.norm == "pre":
            self.input_layernorm = JaxrlRMSNorm(d, eps)
            self.post_attention_layernorm = JaxrlRMSNorm(d, eps)
        elif config.norm == "post":
            self.post_attention_layernorm = JaxrlRMSNorm(d, eps)
            self.post_feedforward_layernorm = JaxrlRMSNorm(d, eps)
        elif config.norm == "siamese":
            self.siamese = JaxrlSiameseNorms(config)
        else:
            self.siamese = JaxrlSiameseHybridNorms(config)

    def forward(self, x, y, cos, sin, bias):
        attn = lambda u: self.self_attn(u, cos, sin, bias)  # noqa: E731
        if self.norm_kind == "pre":
            x = x + attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x)), None
        if self.norm_kind == "post":
            x = self.post_attention_layernorm(x + attn(x))
            return self.post_feedforward_layernorm(x + self.mlp(x)), None
        if self.norm_kind == "siamese_hybrid":
            x, y = self.siamese.attention(x, y, attn, self.c)
            return self.siamese.mlp(x, y, self.mlp, self.c)
        x, y = self.siamese.apply("attn", x, y, attn, self.c)
        return self.siamese.apply("mlp", x, y, self.mlp, self.c)


class JaxrlPreTrainedModel(PreTrainedModel):
    config_class = JaxrlDecoderConfig
    base_model_prefix = "model"
    _no_split_modules = ["JaxrlDecoderLayer"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, JaxrlRMSNorm):
            nn.init.ones_(module.weight)


class JaxrlModel(JaxrlPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(JaxrlDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = JaxrlRMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.norm in ("siamese", "siamese_hybrid"):
            self.norm_x = JaxrlRMSNorm(config.hidden_size, config.rms_norm_eps)
            self.norm_y = JaxrlRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        b, l = input_ids.shape
        if attention_mask is None:
            valid = torch.ones_like(input_ids, dtype=torch.bool)
        else:
            valid = attention_mask.bool()
        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(l, device=input_ids.device)[None].expand(b, l)
            else:
                position_ids = (valid.long().cumsum(-1) - 1).clamp(min=0)
        # Recomputed per call (tiny): a non-persistent buffer is left uninitialised by meta-device loading.
        inv_freq = _inv_freq(self.config).to(input_ids.device)
        angles = position_ids[..., None].float() * inv_freq[None, None]
        angles = torch.cat((angles, angles), dim=-1)
        x = self.embed_tokens(input_ids)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        causal = torch.ones(l, l, dtype=torch.bool, device=x.device).tril()
        allowed = causal[None] & valid[:, None, :]
        bias = torch.zeros(b, l, l, device=x.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
        y = x
        for layer in self.layers:
            x, y = layer(x, y, cos, sin, bias)
        if self.config.norm in ("siamese", "siamese_hybrid"):
            return self.norm(self.norm_x(x) + self.norm_y(y))
        return self.norm(x)


class JaxrlForCausalLM(JaxrlPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.model = JaxrlModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kwargs):
        hidden = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        logits = self.lm_head(hidden).float()
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}


__all__ = ["JaxrlForCausalLM", "JaxrlModel", "JaxrlPreTrainedModel"]
