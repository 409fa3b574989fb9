#!/bin/bash
# bf16 vs fp32 on the quickstart task (issue 32 item 3; results in benchmarks/RESULTS.md, "bf16 end to end"):
# 3 seeds x {bfloat16, float32}, the full warm start and 40 RL steps, held-out accuracy every 10 steps; the old
# log-probs are recomputed by the trainer so every step logs the sampler/trainer mismatch (mismatch/*), with TIS
# (upper 2) on. Then one run per dtype with MIS in a tight band [0.99, 1.01] (3 steps) to show it acts on bf16.
# Usage: experiments/bf16_quickstart.sh [OUT]   (OUT: a new directory, default runs/bf16; ~30 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${1:-runs/bf16}
if [ -e "$OUT" ]; then echo "$OUT exists: give a new directory" >&2; exit 2; fi
mkdir -p "$OUT"
COMMON=(--set logging.progress_bar=false --set logging.tensorboard=false --set checkpoint.every=1000)
for seed in 0 1 2; do for dt in bfloat16 float32; do
  .venv/bin/jaxrl train --run-dir "$OUT/q_${dt}_s$seed" "${COMMON[@]}" --set "model.dtype=$dt" \
    --set "train.seed=$seed" --set train.steps=40 --set train.eval_every=10 \
    --set rollout.logprobs_from_sampler=false --set algorithm.mismatch.mode=tis > "$OUT/q_${dt}_s$seed.log" 2>&1
  tail -1 "$OUT/q_${dt}_s$seed.log"
done; done
for dt in bfloat16 float32; do
  .venv/bin/jaxrl train --run-dir "$OUT/mis_$dt" "${COMMON[@]}" --set "model.dtype=$dt" --set train.steps=3 \
    --set train.eval_every=0 --set algorithm.mismatch.mode=mis --set algorithm.mismatch.lower=0.99 \
    --set algorithm.mismatch.upper=1.01 > "$OUT/mis_$dt.log" 2>&1
  tail -1 "$OUT/mis_$dt.log"
done
