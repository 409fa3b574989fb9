"""Rewards from models: a trained reward model (`type: model`) and a pairwise judge (`type: pairwise`).

* `model_reward(prompts, completions, *, checkpoint, ...)`: r_i = RM(prompt_i + " " + completion_i + EOS), the
  same text layout `jaxrl train-rm` trains on (`jaxrl.reward_model.data.encode_text`). Rows are right-padded
  to a bucket length and scored in fixed-size jitted batches (one compilation per bucket). The loaded model is
  cached per (checkpoint, dtype) in `_load`, so a reward spec with `params: {checkpoint: ...}` loads it once.
  Parameters are placed replicated over `mesh` when a caller passes one, else on the default device.
* `pairwise_reward(prompts, completions, *, judge, group_size, mode)`: within each group of G completions of
  one prompt (rows contiguous), the judge `judge(prompt, a, b) -> S` (S > 0: a better) is called on every
  ordered pair, and `jaxrl.losses.openrs.pairwise_group_rewards` turns the G×G matrix into per-sample rewards
  (OpenRS-style win rate, spec 7c [READING]). A failing judge call (it raises or returns NaN) leaves that
  pair out; the samples of a group with no judged pair fail (None), so a judge failing on every pair trips
  the run's reward-failure guard (`jaxrl.rewards.failures`) instead of training on rewards of 0.

`load_scorer_model` is the library's loader for the three checkpoint layouts (`jaxrl eval-rm` can use it too).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl.errors import CheckpointError, ConfigError
from jaxrl.rewards.imports import import_function
from jaxrl.sharding import hosts

log = logging.getLogger(__name__)


def load_scorer_model(path: str | os.PathLike):
    """(reward model, tokenizer) from a train-rm run dir, an RM checkpoint or an HF sequence-cls directory."""
    from jaxrl.io.model_io import load_tokenizer

    p = Path(path)
    if (p / "config.json").is_file():
        from jaxrl.reward_model.export import import_reward_model

        model, tokenizer = import_reward_model(p), load_tokenizer(p)
    else:
        from jaxrl.reward_model.model import load_reward_model

        model, tokenizer = load_reward_model(p)
    if tokenizer is None:
        raise CheckpointError(f"{path}: no tokenizer saved with the reward model")
    return model, tokenizer


@functools.lru_cache(maxsize=4)
def _load(checkpoint: str, dtype: str):
    """(state, tokenizer, jitted scorer) of an RM checkpoint, cached per (checkpoint, dtype)."""
    model, tokenizer = load_scorer_model(checkpoint)
    if dtype != model.cfg.dtype:
        raise ConfigError(f"rewards: reward model {checkpoint} is {model.cfg.dtype}; dtype={dtype!r} differs")
    graphdef, state = nnx.split(model)

    @jax.jit
    def scorer(state, tokens_BL):
        return nnx.merge(graphdef, state)(tokens_BL)[0]

    return state, tokenizer, scorer


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return int(2 ** math.ceil(math.log2(max(n, 1))))


def model_reward(prompts: list[str], completions: list[str], *, checkpoint: str, batch_size: int = 32,
                 max_len: int = 1024, buckets: tuple[int, ...] = (64, 128, 256, 512, 1024),
                 dtype: str = "float32", mesh: Any = None) -> list[float | None]:
    """RM score of each (prompt, completion); None (an error, handled by `on_error`) when longer than
    max_len or not finite."""
    from jaxrl.reward_model.data import encode_text, pad_right

    state, tokenizer, scorer = _load(str(checkpoint), dtype)
    if mesh is not None:
        state = hosts.place_global(state, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    ids = [encode_text(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
    ok = [i for i, s in enumerate(ids) if len(s) <= max_len]
    out: list[float | None] = [None] * len(ids)
    if not ok:
        return out
    length = _bucket(max(len(ids[i]) for i in ok), tuple(buckets))
    tokens = pad_right([ids[i] for i in ok], length, tokenizer.pad_token_id)
    scores = []
    for start in range(0, len(tokens), batch_size):
        chunk = tokens[start:start + batch_size]
        pad = batch_size - len(chunk)
        if pad:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], pad, axis=0)])
        scores.append(np.asarray(scorer(state, jnp.asarray(chunk)))[:batch_size - pad])
    for i, s in zip(ok, np.concatenate(scores)):
        out[i] = float(s) if math.isfinite(float(s)) else None  # a NaN / inf score fails the sample
    return out


def check_groups(prompts: Sequence[str], group_size: int) -> None:
    """ValueError unless the rows come in groups of `group_size` that share their prompt (the trainer's
    rollouts do; an evaluation with one sample per prompt does not, and has no pairs to judge)."""
    n = len(prompts)
    if group_size < 2 or n % group_size:
        raise ConfigError(f"pairwise reward: group_size={group_size} must be >= 2 and divide the {n} "
                          "completions")
    for start in range(0, n, group_size):
        if len(set(prompts[start:start + group_size])) != 1:
            raise ValueError(f"pairwise reward: rows {start}..{start + group_size - 1} do not share one "
                             "prompt (params.group_size must equal rollout.group_size; evaluation with one "
                             "sample per prompt has no pairs)")


def group_win_rates(scores_PGG: np.ndarray, valid_PGG: np.ndarray, *, mode: str, min_score: float
                    ) -> list[float | None]:
    """Per-sample rewards (rows in group order) from the judge's [P, G, G] pair scores; pairs with
    `valid` False (a failed judge call) are left out (`jaxrl.losses.openrs.pairwise_group_rewards`).

    The samples of a group in which no pair was judged in both orders get None: a failure of the reward
    (its `on_error`, the reward-failure guard), not a win rate of 0. (A sample left out of every pair of an
    otherwise judged group keeps its win rate of 0.)"""
    from jaxrl.losses.openrs import pairwise_group_rewards

    rewards = pairwise_group_rewards(jnp.asarray(scores_PGG), mode=mode, min_score=min_score,
                                     pair_mask_PGG=jnp.asarray(valid_PGG))
    valid = np.asarray(valid_PGG, bool)
    judged_P = (valid & np.swapaxes(valid, 1, 2)).any((1, 2))
    rewards_PG = np.asarray(rewards).reshape(valid.shape[:2])
    return [float(r) if judged_P[p] else None for p, row in enumerate(rewards_PG) for r in row]


def pairwise_reward(prompts: list[str], completions: list[str], *,
                    judge: str | Callable[[str, str, str], float],
                    group_size: int, mode: str = "score", min_score: float = 0.0) -> list[float | None]:
    """Per-sample rewards from a pairwise judge function, group by group (see the module docstring)."""
    fn = import_function(judge, "rewards.params.judge") if isinstance(judge, str) else judge
    check_groups(prompts, group_size)
    n = len(completions)
    scores = np.zeros((n // group_size, group_size, group_size), np.float32)
    valid = np.zeros(scores.shape, bool)
    for p in range(n // group_size):
        base = p * group_size
        for i in range(group_size):
            for j in range(group_size):
                if i == j:
                    continue
                try:
                    s = float(fn(prompts[base], completions[base + i], completions[base + j]))
                except Exception as e:  # noqa: BLE001 -- a failing judge call skips the pair, never the batch
                    log.warning("pairwise judge failed on prompt %d pair (%d, %d): %s", p, i, j, e)
                    continue
                if math.isfinite(s):
                    scores[p, i, j], valid[p, i, j] = s, True
    return group_win_rates(scores, valid, mode=mode, min_score=min_score)
