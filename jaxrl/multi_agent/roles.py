"""Roles played by one shared policy, and the joint rollout of their trained rows.

A multi-agent system (MARCH, SSP; spec/multi-agent.md §0) samples several *roles* with the same
weights. Each role has its own prompt builder, its own group definition and its own reward; the rows of the
roles that are trained are laid out in one completion-space `jaxrl.types.Rollout`:

    rows  = [role 0: P groups of G rows | role 1: P groups of G rows | ...]
    record["role"], record["role_id"]   the role of every row (kept through DAPO's select_groups / concat)

Groups are G consecutive rows of one role, so the RL step's group estimator (GRPO: per-group mean and std,
arXiv:2402.03300) never mixes roles (spec §3.8) and needs no change: a group of Solver rows holds the G
answers to one prompt, a group of Checker rows the G trained Checker samples of that prompt's chains.
Rows whose reward is NaN are left out of their group's statistics (`nan_aware` group advantages) and carry
no trained tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl.sampling.rollout_rows import sequences
from jaxrl.sampling import Generation
from jaxrl.types import Rollout, Rows


def role_rows(name: str, prompt_ids: Sequence[Sequence[int]], gen: Generation, group_size: int, tokenizer,
              prompt_buckets: Sequence[int] | None) -> Rows:
    """The rows of one generation call of a role (G = `group_size` samples per prompt, rows p·G + g), as host
    arrays, with their decoded texts."""
    from jaxrl.sampling.rollout_rows import decode
    from jaxrl.sharding import hosts

    pad = int(tokenizer.pad_token_id)
    tokens, mask, cmask, old_logp = sequences(prompt_ids, gen, group_size, pad, prompt_buckets)
    lengths = hosts.to_host(gen.lengths).astype(np.int32)
    texts = decode(tokenizer, tokens[:, -cmask.shape[1]:], lengths)
    return Rows(tokens, mask, cmask, old_logp, lengths, hosts.to_host(gen.finished), texts, role=name)


def _pad_to(x: np.ndarray, left: int, right: int, fill) -> np.ndarray:
    return np.pad(x, ((0, 0), (left, right)), constant_values=fill) if left or right else x


def joint_rollout(parts: Sequence[tuple[Rows, list[dict[str, Any]], np.ndarray]], *,
                  role_ids: dict[str, int], reward_names: tuple[str, ...], weights_R: np.ndarray, pad_id: int,
                  metrics: dict[str, float], score_infos: tuple = (),
                  group_sizes: Sequence[int] | None = None) -> Rollout:
    """Concatenates the trained roles' rows into one `Rollout`.

    Args:
      parts: (rows, records, rewards_BR) per trained role (`Rows.role` names it), in row order; records are
        the rows' dataset records (one per row); a row whose combined reward is NaN gets no trained tokens.
      role_ids: role name -> id (the system's fixed numbering); written into each row's record.
      reward_names, weights_R: the R reward columns shared by every role (0 where a column is not the role's).
      score_infos: the `jaxrl.rewards.ScoreInfo` of the scoring calls (the run's reward-failure tracker).
      group_sizes: each part's group size (rows normalised together): the rollout's segments are the roles
        (`Rollout.segment_B` = role id), so no advantage statistic mixes roles. None: the run's group size
        for every role, one segment.
    """
    if not parts:
        raise ValueError("joint_rollout: no trained role has rows")
    if group_sizes is not None and len(group_sizes) != len(parts):
        raise ValueError(f"joint_rollout: {len(group_sizes)} group sizes for {len(parts)} roles")
    width = max(r.prompt_width for r, _, _ in parts)
    comp = max(r.completion_mask_BT.shape[1] for r, _, _ in parts)
    cols = {k: [] for k in ("tokens", "mask", "cmask", "logp", "rewards", "lengths", "finished")}
    records: list[dict[str, Any]] = []
    completions: list[str] = []
    for rows, recs, r_BR in parts:
        n = rows.tokens_BL.shape[0]
        if len(recs) != n or r_BR.shape != (n, len(reward_names)):
            raise ValueError(f"role {rows.role}: {n} rows, {len(recs)} records, rewards {r_BR.shape}")
        left, right = width - rows.prompt_width, comp - rows.completion_mask_BT.shape[1]
        trained_B = ~np.isnan((r_BR * weights_R[None]).sum(1))
        cols["tokens"].append(_pad_to(rows.tokens_BL, left, right, pad_id))
        cols["mask"].append(_pad_to(rows.mask_BL, left, right, False))
        cols["cmask"].append(_pad_to(rows.completion_mask_BT, 0, right, False) & trained_B[:, None])
        cols["logp"].append(_pad_to(rows.old_logp_BT, 0, right, 0.0))
        cols["rewards"].append(r_BR.astype(np.float32))
        cols["lengths"].append(rows.lengths_B)
        cols["finished"].append(rows.finished_B)
        records += [dict(rec, role=rows.role, role_id=role_ids[rows.role]) for rec in recs]
        completions += rows.completions
    cat = {k: np.concatenate(v, axis=0) for k, v in cols.items()}
    segment_B, sizes = None, ()
    if group_sizes is not None:
        size_of = dict.fromkeys(range(max(role_ids.values()) + 1), 0)
        for (rows, _, _), g in zip(parts, group_sizes):
            if g < 1 or rows.tokens_BL.shape[0] % g:
                raise ValueError(f"role {rows.role}: group size {g} does not divide its "
                                 f"{rows.tokens_BL.shape[0]} rows")
            size_of[role_ids[rows.role]] = int(g)
        segment_B = np.asarray([r["role_id"] for r in records], np.int32)
        sizes = tuple(size_of[i] for i in sorted(size_of))
    rows = Rows(cat["tokens"].astype(np.int32), cat["mask"], cat["cmask"], cat["logp"].astype(np.float32),
                cat["lengths"], cat["finished"], completions)
    return Rollout.of(rows, records=records, rewards_BR=cat["rewards"], weights_R=np.asarray(weights_R, np.float32),
                      reward_names=tuple(reward_names), metrics=dict(metrics), score_infos=tuple(score_infos),
                      segment_B=segment_B, segment_sizes=sizes)


def row_roles(ro: Rollout) -> np.ndarray:
    """The role id of every row of a multi-agent rollout."""
    return np.asarray([r["role_id"] for r in ro.records], np.int32)


def role_metrics(name: str, rewards_B: np.ndarray, lengths_B: np.ndarray) -> dict[str, float]:
    """`role/<name>/reward/mean` (NaN rows left out) and `role/<name>/response_length/mean`."""
    finite = rewards_B[~np.isnan(rewards_B)]
    return {f"role/{name}/reward/mean": float(finite.mean()) if finite.size else float("nan"),
            f"role/{name}/response_length/mean":
                float(np.mean(lengths_B)) if len(lengths_B) else float("nan")}
