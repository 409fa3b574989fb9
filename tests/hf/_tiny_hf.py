"""Tiny random transformers checkpoints (torch) of each supported family, written to a directory."""

import torch
import transformers

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)

FAMILIES = {
    # name: (config class, model class, extra config)
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(num_key_value_heads=2, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 5000.0})),
    "llama3_scaled": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                      dict(num_key_value_heads=1, tie_word_embeddings=True,
                           rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 16})),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(num_key_value_heads=2, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 123456.0})),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(num_key_value_heads=4, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 20000.0})),
}


def make_tiny_hf(family: str, path, seed: int = 0):
    """Save a random fp32 model of `family` to `path`; returns the torch model (eval mode)."""
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(**COMMON, **extra)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # random (not default-initialised) norms and biases, so a mix-up cannot hide
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    return model
