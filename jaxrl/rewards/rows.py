"""Scoring a rollout's rows: the one path from (prompts, completions, records) to the `[B, R]` reward matrix that
single-turn completions, environment episodes and multi-agent roles share.

    rewards_BR, info = score_rows(rewards, prompts_B, completions_B, records_B, lengths_B, owners_B)

A reward function gets each row's dataset fields (its record without the encoder's own keys,
`ENCODER_KEYS`) and `completion_length` (`jaxrl.rewards.score.RewardFn`). Multi-host (tpu/README.md, "How a
step is split across hosts"): with `owners_B` (the process that holds each row, `hosts.row_owners`) each host
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


def score_rows(rewards, prompts_B: Sequence[str], completions_B: Sequence[str],
               records_B: Sequence[Mapping[str, Any]], lengths_B, owners_B: np.ndarray | None = None
               ) -> tuple[np.ndarray, ScoreInfo]:
    """(rewards_BR float32 of every row, the `ScoreInfo` of all of them). `prompts_B`, `completions_B` need
    to hold text only at this host's rows (`owners_B`; all rows when None)."""
    n = len(records_B)
    mine = np.arange(n) if owners_B is None else np.flatnonzero(owners_B == jax.process_index())
    fields = {k: [records_B[i][k] for i in mine] for k in records_B[0] if k not in ENCODER_KEYS}
    fields["completion_length"] = [int(lengths_B[i]) for i in mine]
    own_BR, info = score(rewards, [prompts_B[i] for i in mine], [completions_B[i] for i in mine], fields)
    if owners_B is None:
        return own_BR, info
    rewards_BR = np.zeros((n, own_BR.shape[1]), np.float32)
    rewards_BR[mine] = own_BR
    rewards_BR = hosts.gather_owned(rewards_BR, owners_B)
    return rewards_BR, global_info(info, rewards_BR)


def global_info(info: ScoreInfo, rewards_BR: np.ndarray) -> ScoreInfo:
    """A host's `ScoreInfo` of its own rows made global: failure counts summed over hosts, per-reward means
    recomputed from the gathered matrix (the same on every host). Single-process: the same values."""
    counts = hosts.sum_across_hosts(np.asarray([info.errors.get(name, 0) for name in info.names], np.int64))
    errors = {name: int(c) for name, c in zip(info.names, counts)}
    metrics = {}
    for k, name in enumerate(info.names):
        finite = rewards_BR[:, k][~np.isnan(rewards_BR[:, k])]
        metrics[f"reward/{name}/mean"] = float(finite.mean()) if finite.size else float("nan")
        metrics[f"reward/{name}/errors"] = float(errors[name])
    return info._replace(errors=errors, metrics=metrics, num_samples=int(rewards_BR.shape[0]))
