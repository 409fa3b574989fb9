"""The `evpv` reward type: EVPV's reliability gate on a process reward model's step rewards, aggregated.

EVPV-PRM (arXiv:2603.16253; reference Qwen-Applications/EVPV-PRM, `evpv_prm/evpv_prm_inference.py` stage 3,
`evpv_prm/compute_bon_metrics.py`). A completion is split into steps at `step_separator` (empty steps
dropped, at most `max_steps`). Per completion with steps t = 1..T::

    r_t          step reward of the PRM, +1 (correct) or −1
    V, n_h, n_l  = premise(prompt, steps): which steps depend on the premise (the image in the paper), and
                   the counts of high / low severity contradictions found in the premise the policy relied on
    p            = max(0, 1 − 0.5·n_h − 0.2·n_l)          (losses.research.evpv.premise_reliability)
    r̃_t          = p·r_t if t ∈ V and r_t = +1, else r_t    (losses.research.evpv.gate_step_rewards)
    R            = aggregator(r̃)

`prm` is a function `prm(prompt, steps) -> list of T step rewards`, or `{checkpoint: PATH, threshold: 0.0,
batch_size: 32, max_len: 1024}`: a `type: model` reward model (`jaxrl.rewards.judges.model_reward.model_reward`)
scoring every step prefix (prompt, steps[:t] joined by the separator), all prefixes of a batch in one call,
with r_t = +1 if the score > threshold else −1; a prefix longer than max_len fails its sample (None, the
reward's on_error). `premise` is a function `premise(prompt, steps) -> (V as T booleans, n_h, n_l)`;
without it no step is gated (p is not used).

Aggregators: `mean` (Σ_t r̃_t / T) and the five of the reference's Best-of-N script
(`losses.research.evpv.AGGREGATORS`: correctness_rate, position_weighted, streak, geometric_mean,
first_error). A completion with no step scores 0 with every aggregator (as the loss library).

Deviations / readings: the gate's use as an RL reward is this module's reading (the paper gates for Best-of-N
selection, and its BoN script aggregates the *ungated* scores); the five reference aggregators test
r̃_t = 1 exactly, so a gated step (p < 1) counts as not correct there, while `mean` keeps its value p. The
premise audit (the reference asks a VLM judge to compare a checklist with an image description) is the user's
`premise` function.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxrl.rewards.imports import import_function

AGGREGATOR_NAMES = ("mean", "correctness_rate", "position_weighted", "streak", "geometric_mean",
                    "first_error")
PRM_DEFAULTS = {"checkpoint": None, "threshold": 0.0, "batch_size": 32, "max_len": 1024}


def split_steps(completion: str, separator: str, max_steps: int) -> list[str]:
    """The non-empty steps of a completion (stripped), at most `max_steps`."""
    return [s.strip() for s in completion.split(separator) if s.strip()][:max_steps]


def _model_step_rewards(spec: Mapping[str, Any], prompts: Sequence[str], steps: Sequence[list[str]],
                        separator: str) -> list[list[float] | None]:
    from jaxrl.rewards.judges.model_reward import model_reward

    cfg = {k: spec.get(k, d) for k, d in PRM_DEFAULTS.items()}
    owner, texts, rows = [], [], []
    for b, (prompt, s) in enumerate(zip(prompts, steps)):
        for t in range(len(s)):
            owner.append(b)
            rows.append(prompt)
            texts.append(separator.join(s[:t + 1]))
    scores = model_reward(rows, texts, checkpoint=str(cfg["checkpoint"]), batch_size=cfg["batch_size"],
                          max_len=cfg["max_len"]) if texts else []
    out: list[list[float] | None] = [[] for _ in prompts]
    for b, score in zip(owner, scores):
        if out[b] is not None:
            out[b] = None if score is None else out[b] + [1.0 if score > cfg["threshold"] else -1.0]
    return out


def _pad(rows: Sequence[Sequence[Any]], width: int, dtype) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype)
    for b, row in enumerate(rows):
        out[b, :len(row)] = row
    return out


def gated_aggregate(step_rewards: Sequence[Sequence[float]], visual: Sequence[Sequence[bool]],
                    n_high: Sequence[float], n_low: Sequence[float], aggregator: str) -> np.ndarray:
    """float32 [B] rewards from ragged step rewards, premise masks and contradiction counts (docstring)."""
    import jax.numpy as jnp

    from jaxrl.losses.research import evpv

    width = max([1, *map(len, step_rewards)])
    r_BT = jnp.asarray(_pad(step_rewards, width, np.float32))
    v_BT = jnp.asarray(_pad(visual, width, bool))
    m_BT = jnp.asarray(_pad([[True] * len(s) for s in step_rewards], width, bool))
    p_B = evpv.premise_reliability(jnp.asarray(n_high, jnp.float32), jnp.asarray(n_low, jnp.float32))
    gated_BT = evpv.gate_step_rewards(r_BT, v_BT, p_B, m_BT)
    if aggregator == "mean":
        count_B = m_BT.sum(-1)
        return np.asarray(gated_BT.sum(-1) / jnp.maximum(count_B, 1), np.float32)
    return np.asarray(evpv.AGGREGATORS[aggregator](gated_BT, m_BT), np.float32)


def evpv_reward(prompts: list[str], completions: list[str], *,
                prm: str | Callable[..., Sequence[float]] | Mapping[str, Any],
                premise: str | Callable[..., Any] | None = None, aggregator: str = "mean",
                step_separator: str = "\n", max_steps: int = 64) -> list[float | None]:
    """Per-sample gated PRM rewards (see the module docstring); None for a sample whose PRM scoring failed."""
    steps = [split_steps(c, step_separator, max_steps) for c in completions]
    if isinstance(prm, Mapping):
        rewards = _model_step_rewards(prm, prompts, steps, step_separator)
    else:
        fn = import_function(prm, "rewards.params.prm") if isinstance(prm, str) else prm
        rewards = [[float(x) for x in fn(p, s)] for p, s in zip(prompts, steps)]
    for r, s in zip(rewards, steps):
        if r is not None and len(r) != len(s):
            raise ValueError(f"evpv: the PRM gave {len(r)} step rewards for {len(s)} steps")
    visual, n_high, n_low = [[False] * len(s) for s in steps], [0.0] * len(steps), [0.0] * len(steps)
    if premise is not None:
        fn = import_function(premise, "rewards.params.premise") if isinstance(premise, str) else premise
        for b, (p, s) in enumerate(zip(prompts, steps)):
            mask, n_high[b], n_low[b] = fn(p, s)
            visual[b] = [bool(x) for x in mask]
            if len(visual[b]) != len(s):
                raise ValueError(f"evpv: the premise function gave {len(visual[b])} flags for {len(s)} steps")
    ok = [i for i, r in enumerate(rewards) if r is not None]
    out: list[float | None] = [None] * len(completions)
    if ok:
        values = gated_aggregate([rewards[i] for i in ok], [visual[i] for i in ok], [n_high[i] for i in ok],
                                 [n_low[i] for i in ok], aggregator)
        for i, v in zip(ok, values):
            out[i] = float(v)
    return out
