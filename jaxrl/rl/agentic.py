"""Multi-turn, tool-using rollouts as a collect stage of the RL step (`env:` in the config).

`collect_env` runs G episodes per record with `jaxrl.envs.collect_episodes` (all live episodes decode each turn
together) and returns them as a completion-space `Rollout`, so every algorithm record, DAPO resampling,
checkpoints and evaluation work on episodes unchanged:

    tokens_BL          = [prompt | action, observation, action, ...]   exactly the ids the model saw
    completion_mask_BT = 1 on sampled action tokens, 0 on observation tokens (never trained on)
    old_logp_BT        = the sampler's log-probs of the action tokens
    rewards_BR         = [episode return | the config's rewards scored on the transcript]

`demonstration_rows` lays out an environment's demonstrations (`env.demonstration(record)`, a list of action
texts) the same way, for the SFT warm start: the model learns the tool format on rows identical to sampled ones.

Environment errors (`jaxrl.envs.contract`): before an `EnvFactory`'s first rollout or warm start, one record
is played through a fresh env (`dry_run`: reset + one step), so a broken environment stops the run (EnvError,
exit 2) before the first update. Episodes ended by an error (on_error "end_episode") score 0 and are reported
as failures of the "env" reward column (`ScoreInfo`), so the run's reward-failure guard stops a run whose
environment fails on every episode for `train.max_failed_reward_steps` consecutive steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxrl import rewards as rewards_lib
from jaxrl.envs import EnvFactory, EpisodeBudget, Episodes, collect_episodes, scripted_episodes
from jaxrl.envs.contract import checked_demonstration, dry_run
from jaxrl.errors import ConfigError
from jaxrl.rewards.rows import score_rows
from jaxrl.types import Rollout
from jaxrl.sampling import SamplingSpec
from jaxrl.sharding import hosts
from jaxrl.learner.train_step import TrainBatch

ENV_REWARD = "env"


def to_rollout(eps: Episodes, rewards, tokenizer) -> Rollout:
    """Episodes as a completion-space `Rollout` (column 0: the episode return; then `rewards` on transcripts).

    Episodes whose hosts drove their own rows (`eps.row_sharding`) give a rollout like
    `jaxrl.rl.collect.sample_and_score`'s: tokens and log-probs as global arrays split over the rows' hosts, each
    transcript scored by its row's owner and the reward matrix gathered."""
    rewards_BR = eps.rewards_B[:, None].astype(np.float32)
    names, weights = (ENV_REWARD,), np.ones((1,), np.float32)
    errors = 0 if eps.errors_B is None else int(eps.errors_B.sum())
    infos = (rewards_lib.ScoreInfo((ENV_REWARD,), weights, {ENV_REWARD: errors}, {}, len(eps.rewards_B),
                                   {ENV_REWARD: eps.first_error or "environment error"} if errors else {}),)
    metrics = dict(eps.metrics)
    metrics[f"reward/{ENV_REWARD}/mean"] = float(eps.rewards_B.mean())
    n = rewards_BR.shape[0]
    owners = None if eps.row_sharding is None else hosts.row_owners(eps.row_sharding, (n,))
    if len(rewards):
        extra_BR, info = score_rows(rewards, eps.prompts, eps.completions, eps.records, eps.lengths_B, owners)
        rewards_BR = np.concatenate([rewards_BR, extra_BR], axis=1)
        names, weights = (*names, *info.names), np.concatenate([weights, info.weights_R])
        infos = (*infos, info)
        metrics.update(info.metrics)
    rows = eps.rows()
    if eps.row_sharding is not None:  # each host's rows to its own devices
        rows = dataclasses.replace(rows, **{k: hosts.host_to_global(getattr(rows, k), eps.row_sharding)
                                            for k in ("tokens_BL", "old_logp_BT")})
    return Rollout.of(rows, records=list(eps.records), rewards_BR=rewards_BR, weights_R=weights, reward_names=names,
                      metrics=metrics, score_infos=infos, pad_id=int(tokenizer.pad_token_id))


def collect_env(graphdef, params, records: list[dict[str, Any]], tokenizer, rewards, env_factory,
                budget: EpisodeBudget, spec: SamplingSpec, seed, *, row_layout=None) -> Rollout:
    """G episodes per record (`spec.num_samples`), decoded turn by turn on the jitted sampler; `seed` is an
    int or a PRNG key (from which the episode sampler's int seed is drawn). `row_layout`: rows -> the
    rows' sharding (`jaxrl.sharding.row_sharding` of the run's mesh), so that each host drives only the
    episodes of the rows it holds; None: every host drives every episode."""
    if not isinstance(seed, (int, np.integer)):
        seed = int(jax.random.randint(seed, (), 0, 2**31 - 1))
    check_once(env_factory, records, tokenizer, budget)
    layout = None if row_layout is None else row_layout(len(records) * spec.num_samples)
    eps = collect_episodes(graphdef, params, records, tokenizer, env_factory, budget, spec, seed,
                           row_sharding=layout)
    return to_rollout(eps, rewards, tokenizer)


def check_once(env_factory, records, tokenizer, budget: EpisodeBudget) -> None:
    """`dry_run` of an `EnvFactory` on its first records (once per factory); other callables are checked at
    their first call only."""
    if isinstance(env_factory, EnvFactory) and not env_factory.checked and len(records):
        dry_run(env_factory, records[0], tokenizer, timeout_s=budget.step_timeout_s)
        env_factory.checked = True


def demonstration_rows(records, tokenizer, env_factory, budget: EpisodeBudget, *,
                       row_sharding=None) -> TrainBatch:
    """Expert rows of the environment's demonstrations (`env.demonstration(record)`), SFT weight 1.

    `row_sharding` (the train batch's row layout): each host plays only the demonstrations of the rows it
    holds; the rows of other hosts are left empty (`jaxrl.rl.batch.shard_batch` reads each host's own rows)."""
    probe = env_factory(tokenizer)
    if not callable(getattr(probe, "demonstration", None)):
        raise ConfigError(f"sft_warmup.steps > 0 with env {type(probe).__name__}: the environment has no "
                          "demonstration(record) method giving the action texts to imitate")
    check_once(env_factory, records, tokenizer, budget)
    index = {id(r): i for i, r in enumerate(records)}
    eps = scripted_episodes(records, tokenizer, env_factory,
                            lambda r: checked_demonstration(probe, r, index.get(id(r), 0)),
                            budget, row_sharding=row_sharding)
    w, n = eps.prompt_width, eps.tokens_BL.shape[0]
    cmask = eps.loss_mask_BL[:, w:]
    zeros = np.zeros(cmask.shape, np.float32)
    ones = np.ones((n,), np.float32)
    return TrainBatch(eps.tokens_BL, eps.mask_BL, cmask, zeros, zeros, zeros, ones * 0.2, ones * 0.2, ones)
