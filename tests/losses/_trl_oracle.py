"""Calls TRL's own GRPOTrainer code (TRL 1.16) on given arrays, for agreement tests of jaxrl's losses.

Nothing of TRL is copied: `GRPOTrainer._compute_loss` and `GRPOTrainer._generate_and_score_completions` run
unchanged on a light stand-in for the trainer (`types.SimpleNamespace` holding only the attributes they read),
with the model forward and the generation replaced by the given log-probs. Float64 torch throughout.
"""

import collections
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")


def _accelerator():
    return types.SimpleNamespace(num_processes=1, process_index=0, device=torch.device("cpu"),
                                 reduce=lambda x, reduction="sum": x, gather=lambda x: x,
                                 gather_for_metrics=lambda x: x)


def _metrics():
    return {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}


def trl_compute_loss(logp, old_logp, adv, mask, *, loss_type, level="token", epsilon_low=0.2,
                     epsilon_high=0.2, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, is_ratio=None):
    """Runs `GRPOTrainer._compute_loss` (beta=0, no entropy bonus, one process, no accumulation).

    Args: numpy arrays logp/old_logp/mask [B, T], adv [B] or [B, T]; TRL config values; is_ratio: optional
      vLLM IS weights ([B, T] or [B, 1]) multiplied into the per-token loss.

    Returns:
      (loss float, d loss / d logp [B, T] numpy, TRL's logged metrics dict of lists).
    """
    logp_t = torch.tensor(np.asarray(logp, np.float64), requires_grad=True)
    b, t = logp_t.shape
    mask_t = torch.tensor(np.asarray(mask, np.int64))
    stub = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp_t, torch.zeros_like(logp_t), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=level, beta=0.0,
        loss_type=loss_type, epsilon_low=epsilon_low, epsilon_high=epsilon_high,
        args=types.SimpleNamespace(delta=None, sapo_temperature_pos=sapo_temperature_pos,
                                   sapo_temperature_neg=sapo_temperature_neg, steps_per_generation=1),
        use_vllm=is_ratio is not None, vllm_importance_sampling_correction=is_ratio is not None,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=_accelerator(), _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics=_metrics())
    inputs = {
        "prompt_ids": torch.zeros((b, 1), dtype=torch.long),
        "prompt_mask": torch.ones((b, 1), dtype=torch.long),
        "completion_ids": torch.zeros((b, t), dtype=torch.long), "completion_mask": mask_t,
        "advantages": torch.tensor(np.asarray(adv, np.float64)),
        "old_per_token_logps": torch.tensor(np.asarray(old_logp, np.float64)),
        "num_items_in_batch": mask_t.sum().to(torch.float64),
    }
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = torch.tensor(np.asarray(is_ratio, np.float64))
    loss = grpo_trainer.GRPOTrainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.item(), logp_t.grad.numpy(), stub._metrics["train"]


def trl_vllm_importance_weights(train_logp, sampler_logp, mask, *, mode, clip_min=None, clip_max=3.0):
    """Runs `GRPOTrainer._generate_and_score_completions` with a stub generator returning `sampler_logp` and a
    stub forward returning `train_logp`; returns (importance_sampling_ratio as TRL stores it, [B, T] or
    [B, 1], TRL's logged metrics). Rows are right-padded: row i has mask[i].sum() tokens (a prefix mask)."""
    train_logp = np.asarray(train_logp, np.float64)
    sampler_logp = np.asarray(sampler_logp, np.float64)
    lens = np.asarray(mask, bool).sum(1)
    if not np.array_equal(np.asarray(mask, bool), np.arange(train_logp.shape[1])[None] < lens[:, None]):
        raise ValueError("trl_vllm_importance_weights needs right-padded prefix masks")
    b = train_logp.shape[0]
    # TRL pads the completions to the longest one; pad our arrays' width down to it.
    width = int(lens.max())
    train_t = torch.tensor(train_logp[:, :width])

    def generate(prompts):
        ids = [[1] * int(n) for n in lens]
        logps = [list(sampler_logp[i, :n]) for i, n in enumerate(lens)]
        return [[5] for _ in prompts], ids, None, ["c"] * len(prompts), logps, {}, None, None

    stub = types.SimpleNamespace(
        accelerator=_accelerator(),
        model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        environment_factories=None, tools=[], environments=[], _generate=generate,
        _tokenizer=types.SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None,
        mask_truncated_completions=False,
        args=types.SimpleNamespace(per_device_train_batch_size=b, steps_per_generation=1,
                                   gradient_accumulation_steps=1, gradient_checkpointing_kwargs=None),
        num_iterations=1, use_vllm=True, vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
        vllm_importance_sampling_clip_max=clip_max,
        _get_per_token_logps_and_entropies=lambda *a, **k: (train_t, None, None), beta=0.0,
        _calculate_rewards=lambda *a: torch.zeros((b, 1), dtype=torch.float64), num_generations=b,
        multi_objective_aggregation="sum_then_normalize", reward_weights=torch.ones(1, dtype=torch.float64),
        scale_rewards="group", reward_func_names=["r"], _metrics=_metrics(),
        _logs={"prompt": [], "completion": [], "rewards": collections.defaultdict(list), "advantages": [],
               "extra": collections.defaultdict(list), "images": []},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False)
    out = grpo_trainer.GRPOTrainer._generate_and_score_completions(stub, [{"prompt": "p"}] * b)
    ratio = out["importance_sampling_ratio"].numpy()
    if ratio.shape[1] != 1:
        ratio = np.pad(ratio, ((0, 0), (0, train_logp.shape[1] - width)))
    return ratio, stub._metrics["train"]
