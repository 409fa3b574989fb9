"""`TransformerConfig`: the frozen, hashable description of one decoder-only transformer, with presets.

Every field is a plain scalar, string or tuple, so a config can be a static `jax.jit` argument and can
sit in an `nnx.GraphDef`. Presets copy the published Hugging Face `config.json` values of each checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

_NORMS = ("pre", "post", "siamese", "siamese_hybrid")
SIAMESE_NORMS = ("siamese", "siamese_hybrid")  # two residual streams (x, y), merged by norm_x/norm_y
_DTYPES = ("float32", "bfloat16")
REMATS = ("none", "full", "dots", "mlp", "attention")  # `remat` below
_ATTENTIONS = ("xla", "cudnn", "splash")  # jaxrl.models.attention_fused.KERNELS
_FAMILIES = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3 "rope_type=llama3" frequency scaling (HF `_compute_llama3_parameters`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings <= 0:
            raise ValueError("rope_scaling.original_max_position_embeddings must be > 0")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and switches of a Llama / Qwen2 / Qwen3 style decoder.

    Dimension letters: V vocab_size, D hidden_size, Y num_layers, N num_heads, K num_kv_heads, H head_dim,
    F mlp_dim.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Optional[Llama3RopeScaling] = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    norm: str = "pre"
    dtype: str = "float32"
    param_dtype: str = "float32"
    # "none", "full" / "dots" (a checkpointed layer), "mlp" (the MLP's projections only), "attention" (a
    # checkpointed layer keeping the attention core's output and softmax statistics: the backward recomputes the
    # projections, norms and MLP, never the O(L^2) attention forward; with the "xla" core only: the fused
    # kernels keep their own residuals, and under "attention" are recomputed as under "full")
    remat: str = "none"
    scan_layers: bool = True  # False: unroll the layer loop (execution only; parameters are the same)
    # attention kernel of the full-sequence forward (execution only): "xla", the blocked core
    # (`jaxrl.models.attention`); "cudnn", cuDNN flash attention (GPU, bf16); "splash", Pallas splash
    # attention (TPU) (`jaxrl.models.attention_fused`)
    attention: str = "xla"
    max_position_embeddings: int = 4096
    family: str = "llama"
    bos_token_id: Optional[int] = None
    eos_token_id: Union[None, int, tuple[int, ...]] = None
    pad_token_id: Optional[int] = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "mlp_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TransformerConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"TransformerConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"TransformerConfig.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"TransformerConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise ValueError(
                f"TransformerConfig.rope_scaling must be None or Llama3RopeScaling, got {self.rope_scaling!r}"
            )
        for name, allowed in (("norm", _NORMS), ("dtype", _DTYPES), ("param_dtype", _DTYPES),
                              ("remat", REMATS), ("family", _FAMILIES), ("attention", _ATTENTIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"TransformerConfig.{name}={getattr(self, name)!r}; allowed: {allowed}")
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"TransformerConfig.scan_layers must be a bool, got {self.scan_layers!r}")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def two_stream(self) -> bool:
        """True for the SiameseNorm variants ("siamese" = post-pre, "siamese_hybrid" = hybrid-pre)."""
        return self.norm in SIAMESE_NORMS

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The stop tokens as a tuple (empty when unknown)."""
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    # ---------------------------------------------------------------- presets (HF config.json values)

    @classmethod
    def tiny(cls, **changes) -> "TransformerConfig":
        """2 layers, D=32, V=64: for tests (GQA 4 query heads over 2 kv heads)."""
        base = cls(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                   mlp_dim=64, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=128,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
        return dataclasses.replace(base, **changes)

    @classmethod
    def smollm2_135m(cls) -> "TransformerConfig":
        """HuggingFaceTB/SmolLM2-135M-Instruct."""
        return cls(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                   mlp_dim=1536, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
                   max_position_embeddings=8192, family="llama", bos_token_id=1, eos_token_id=2,
                   pad_token_id=2)

    @classmethod
    def qwen2_5_0_5b(cls) -> "TransformerConfig":
        """Qwen/Qwen2.5-0.5B."""
        return cls(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                   head_dim=64, mlp_dim=4864, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                   qkv_bias=True, max_position_embeddings=32768, family="qwen2", bos_token_id=151643,
                   eos_token_id=151643)

    @classmethod
    def qwen2_5_1_5b(cls) -> "TransformerConfig":
        """Qwen/Qwen2.5-1.5B."""
        return cls(vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                   head_dim=128, mlp_dim=8960, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                   qkv_bias=True, max_position_embeddings=131072, family="qwen2", bos_token_id=151643,
                   eos_token_id=151643)

    @classmethod
    def qwen3_0_6b(cls) -> "TransformerConfig":
        """Qwen/Qwen3-0.6B."""
        return cls(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                   head_dim=128, mlp_dim=3072, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                   qk_norm=True, max_position_embeddings=40960, family="qwen3", bos_token_id=151643,
                   eos_token_id=151645)

    @classmethod
    def qwen3_1_7b(cls) -> "TransformerConfig":
        """Qwen/Qwen3-1.7B."""
        return cls(vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                   head_dim=128, mlp_dim=6144, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                   qk_norm=True, max_position_embeddings=40960, family="qwen3", bos_token_id=151643,
                   eos_token_id=151645)

    @classmethod
    def qwen3_8b(cls) -> "TransformerConfig":
        """Qwen/Qwen3-8B."""
        return cls(vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                   head_dim=128, mlp_dim=12288, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=False,
                   qk_norm=True, max_position_embeddings=40960, family="qwen3", bos_token_id=151643,
                   eos_token_id=151645)
