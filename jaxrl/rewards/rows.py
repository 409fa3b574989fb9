"""Scoring a rollout's rows: the one path from (prompts, completions, records) to the `[N, K]` reward matrix that
single-turn completions, environment episodes and multi-agent roles share.

    rewards_NK, info = score_rows(rewards, prompts_N, completions_N, records_N, lengths_N, owners_N)

A reward function gets each row's dataset fields (its record without the encoder's own keys,
`ENCODER_KEYS`) and `completion_length` (`jaxrl.rewards.score.RewardFn`). Multi-host (tpu/README.md, "How a
step is split across hosts"): with `owners_N` (the process that holds each row, `hosts.row_owners`) each host
scores only its own rows, whose texts only it decoded; the matrix is then gathered and the report made global
(`global_info`), so every host takes the same decisions. Without owners every host scores every row (rows
whose texts every host has, e.g. a multi-agent system's).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxrl.rewards.score import ScoreInfo, score
from jaxrl.sharding import hosts

ENCODER_KEYS = ("prompt", "prompt_ids", "sft_target", "target_ids")  # the data encoder's outputs, not fields


def score_rows(rewards, prompts_N: Sequence[str], completions_N: Sequence[str],
               records_N: Sequence[Mapping[str, Any]], lengths_N, owners_N: np.ndarray | None = None
               ) -> tuple[np.ndarray, ScoreInfo]:
    """(rewards_NK float32 of every row, the `ScoreInfo` of all of them). `prompts_N`, `completions_N` need
    to hold text only at this host's rows (`owners_N`; all rows when None)."""
    n = len(records_N)
    mine = np.arange(n) if owners_N is None else np.flatnonzero(owners_N == jax.process_index())
    fields = {k: [records_N[i][k] for i in mine] for k in records_N[0] if k not in ENCODER_KEYS}
    fields["completion_length"] = [int(lengths_N[i]) for i in mine]
    own_NK, info = score(rewards, [prompts_N[i] for i in mine], [completions_N[i] for i in mine], fields)
    if owners_N is None:
        return own_NK, info
    rewards_NK = np.zeros((n, own_NK.shape[1]), np.float32)
    rewards_NK[mine] = own_NK
    rewards_NK = hosts.gather_owned(rewards_NK, owners_N)
    return rewards_NK, global_info(info, rewards_NK)


def global_info(info: ScoreInfo, rewards_NK: np.ndarray) -> ScoreInfo:
    """A host's `ScoreInfo` of its own rows made global: failure counts summed over hosts, per-reward means
    recomputed from the gathered matrix (the same on every host). Single-process: the same values."""
    counts = hosts.sum_across_hosts(np.asarray([info.errors.get(name, 0) for name in info.names], np.int64))
    errors = {name: int(c) for name, c in zip(info.names, counts)}
    metrics = {}
    for k, name in enumerate(info.names):
        finite = rewards_NK[:, k][~np.isnan(rewards_NK[:, k])]
        metrics[f"reward/{name}/mean"] = float(finite.mean()) if finite.size else float("nan")
        metrics[f"reward/{name}/errors"] = float(errors[name])
    return info._replace(errors=errors, metrics=metrics, num_samples=int(rewards_NK.shape[0]))
