"""Configuration of jaxrl decoder models exported with post-norm or SiameseNorm (trust_remote_code).

Written for jaxrl (not derived from another modeling file). Mirrors `jaxrl.models.TransformerConfig`; the
field names follow transformers' Llama/Qwen configs so the same `config.json` keys mean the same things.
"""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig


@strict
class JaxrlDecoderConfig(PreTrainedConfig):
    """`norm`: "pre" | "post" | "siamese" | "siamese_hybrid" residual wiring; `qk_norm`: RMSNorm on q and k
    per head (Qwen3)."""

    model_type = "jaxrl_decoder"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 64
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_parameters: dict | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    norm: str = "siamese"
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    use_cache: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        if self.norm not in ("pre", "post", "siamese", "siamese_hybrid"):
            raise ValueError(f"norm={self.norm!r}; allowed: 'pre', 'post', 'siamese', 'siamese_hybrid'")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.rope_parameters.get("rope_type", "default") not in ("default", "llama3"):
            kind = self.rope_parameters.get("rope_type")
            raise ValueError(f"rope_type {kind!r}; allowed: 'default', 'llama3'")


__all__ = ["JaxrlDecoderConfig"]
