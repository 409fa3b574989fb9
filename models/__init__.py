"""jaxrl.models: Flax NNX decoder-only transformers (Llama / Qwen2 / Qwen3, pre/post/SiameseNorm)."""
