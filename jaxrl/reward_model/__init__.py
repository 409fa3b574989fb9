"""Reward models: Bradley-Terry training with optional DIR debiasing (arXiv:2512.23461), bias evaluation,
HF export.

    model = RewardModel(cfg, rngs=nnx.Rngs(0)); r_B, h_BD = model(tokens_BL)
    report = train_rm(load_rm_config("configs/rm_length_dir.yaml"), "runs/rm")
    export_reward_model(model, "out/hf_rm", tokenizer)   # LlamaForSequenceClassification & co.
"""

from jaxrl.reward_model.config import (DebiasConfig, RMDataConfig, RMExperimentConfig, RMTrainConfig,
                                      load_rm_config)
from jaxrl.reward_model.evaluate import evaluate_pairs, margin_report, plugin_mi
from jaxrl.reward_model.export import export_reward_model, import_reward_model
from jaxrl.reward_model.model import RewardModel, last_token_index, load_reward_model, save_reward_model
from jaxrl.reward_model.run import train_rm

__all__ = [
    "DebiasConfig", "RMDataConfig", "RMExperimentConfig", "RMTrainConfig", "RewardModel", "evaluate_pairs",
    "export_reward_model", "import_reward_model", "last_token_index", "load_reward_model", "load_rm_config",
    "margin_report", "plugin_mi", "save_reward_model", "train_rm",
]
