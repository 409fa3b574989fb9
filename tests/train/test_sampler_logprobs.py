"""Issue 33 item 5, through the real CLI: what `old_logp` means under temperature and truncated sampling.

The sampler's log-probs are the tempered policy's over the whole vocabulary, log softmax(z/τ) at the sampled
token, with top-k / top-p not applied (`jaxrl.sampling.filters.sampled_logprobs`, as TRL and verl), and the
trainer recomputes exactly that (`LossSpec.temperature` = `rollout.temperature`). So a run that takes its
old log-probs from the sampler (`rollout.logprobs_from_sampler: true`) and one that recomputes them with the
trainer's forward (`false`) train identically step by step at τ = 0.7 with top-k and top-p, and the first
update's ratio is exactly 1 (no token clipped). Function-level checks: tests/sampling/test_generate.py and
tests/agent/test_multiturn.py (multi-turn episodes).
"""

from __future__ import annotations

import numpy as np

from _common import metrics, run_train

TRUNCATED = ("rollout.temperature=0.7", "rollout.top_k=12", "rollout.top_p=0.9", "algorithm.mini_batches=1")


def test_sampler_and_trainer_old_logprobs_train_alike_at_temperature_with_top_k_top_p(tmp_path):
    rows = {}
    for source in ("true", "false"):
        proc = run_train(tmp_path / source, *TRUNCATED, f"rollout.logprobs_from_sampler={source}",
                         "checkpoint.every=100")  # no checkpoint is read: the final one only
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows[source] = [r for r in metrics(tmp_path / source) if "loss" in r]
    assert [r["step"] for r in rows["true"]] == [1, 2] == [r["step"] for r in rows["false"]]
    for got, want in zip(rows["true"], rows["false"]):
        for key in ("loss", "clip_frac", "entropy", "reward/mean", "train/grad_norm"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{key} {got['step']}")
    assert rows["true"][0]["clip_frac"] == 0.0  # step 1, one mini-batch: ratio exactly 1 before the update
    assert rows["true"][1]["loss"] != rows["true"][0]["loss"]  # the steps did train on different rollouts
