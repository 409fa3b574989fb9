"""Test fixtures: tiny configs of every family and a random Hugging Face torch twin of a config.

torch and transformers are imported lazily (test-only dependencies; jaxrl never needs torch at run time).
"""

from __future__ import annotations

import numpy as np

from jaxrl.models.config import Llama3RopeScaling, TransformerConfig
from jaxrl.models.hf_io import config_to_hf

_LLAMA3_SCALING = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=64)

# Every config keeps head_dim=8 (RoPE frequencies 1, 0.1, 0.01, 0.001 at theta 10⁴), so with
# original_max_position_embeddings=64 the Llama-3 scaling hits its low, medium and high frequency bands.
TINY_CONFIGS: dict[str, TransformerConfig] = {
    "llama_untied": TransformerConfig.tiny(),
    "llama_tied": TransformerConfig.tiny(tie_embeddings=True),
    "qwen2_bias": TransformerConfig.tiny(family="qwen2", qkv_bias=True),
    "qwen3_qk_norm": TransformerConfig.tiny(family="qwen3", qk_norm=True, tie_embeddings=True),
    "llama_mqa_kv1": TransformerConfig.tiny(num_kv_heads=1),
    "llama_mha_kv4": TransformerConfig.tiny(num_kv_heads=4),
    "qwen3_gqa_6q_3kv": TransformerConfig.tiny(family="qwen3", qk_norm=True, num_heads=6, num_kv_heads=3),
    "llama_theta_5000": TransformerConfig.tiny(rope_theta=5000.0),
    "llama3_rope_scaling": TransformerConfig.tiny(rope_theta=10000.0, rope_scaling=_LLAMA3_SCALING),
}


def hf_config(cfg: TransformerConfig):
    """The transformers `PreTrainedConfig` of a pre-norm `cfg` (eager attention, fp32)."""
    import transformers

    d = config_to_hf(cfg)
    model_type = d.pop("model_type")
    d.pop("architectures")
    config = transformers.CONFIG_MAPPING[model_type](**d)
    config._attn_implementation = "eager"
    return config


def random_hf_model(cfg: TransformerConfig, seed: int = 0):
    """A float32 `AutoModelForCausalLM` for `cfg` with every weight random (norms ≈ 1 ± 0.1, biases too).

    HF initialises norms to one and biases to zero; perturbing them makes parity tests see their placement.
    """
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(cfg), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "norm" in name else 0.02))
    return model.eval()


def state_dict_numpy(model) -> dict[str, np.ndarray]:
    """A torch model's state_dict as float32 numpy arrays (copies)."""
    return {name: t.detach().cpu().float().numpy().copy() for name, t in model.state_dict().items()}
