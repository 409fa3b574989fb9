"""Reading and writing what a run produces and starts from: orbax checkpoints (`checkpoint`), Hugging Face
directories (`hf`: import, export, configs), GGUF files (`gguf`), LoRA adapters (`lora_io`), model weights in
any of those forms (`model_io`, `model_params`), sharded safetensors directories (`_safetensors_dir`), and the
model and tokenizer a `ModelConfig` / `TokenizerConfig` names (`build`).

Weights load only from safetensors, orbax, GGUF, JSON and YAML: never pickle, never remote code we did not
write. Nothing here reads the experiment config; callers pass paths and small configs.
"""
