"""The `Algorithm` record: everything that makes one RL method, in one place.

An RL step is a straight line of stages (`jaxrl.rl.step`):

    collect -> resample? -> shape rewards* -> advantages -> assemble (+ extra rows?) -> update

A method is one `Algorithm` record: its advantage function (required) and the optional stages it adds —
reward shaping (CLIPO's contrastive bonus), resampling (DAPO's dynamic sampling), extra rows (AFRL's expert
rows with an SFT loss) — plus the loss settings it changes. Registering a record under a name
(`ALGORITHMS[name] = record`) makes `algorithm.name: <name>` valid in a config; nothing else needs editing.

The stages receive `AlgoSettings`, a frozen view of the `algorithm:` config section resolved once at setup
(the group size, the clip bounds and each method's own sub-section), never the experiment config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class AlgoSettings:
    """What an algorithm's stages may read, resolved once at setup.

    Attributes:
      group_size: G, samples per prompt (rows of a group are contiguous).
      eps: ε of the group standardisation.
      clip_low, clip_high: PPO clip bounds ε_low, ε_high.
      section: the typed `algorithm:` config section (`jaxrl.config.AlgorithmConfig`): the settings every
        method shares (`clip`, `kl`, ...); a method's own are `params`.
      task_columns: reward columns that score the task (not length shaping such as the overlong penalty); the
        DAPO keep filter and CLIPO's correctness use their weighted sum.
      params: the record's own hyper-parameters (an instance of `Algorithm.params`, from `algorithm.params`,
        validated at config load); None for a record that declares none.
    """

    group_size: int
    eps: float
    clip_low: float
    clip_high: float
    section: Any
    task_columns: tuple[int, ...] = ()
    params: Any = None


class Advantages(NamedTuple):
    """Per-token advantages of the completion positions and per-sample clip bounds."""

    adv_BT: np.ndarray
    clip_low_B: np.ndarray
    clip_high_B: np.ndarray
    metrics: dict[str, float]


# (rewards_BR, weights_R, completion_mask_BT, settings) -> Advantages
AdvantageFn = Callable[[np.ndarray, np.ndarray, np.ndarray, AlgoSettings], Advantages]


class Shaper(Protocol):
    """A reward-shaping stage with host-side state (e.g. CLIPO's contrastive head).

    `__call__` returns one extra reward column (weight 1) and metrics; `actor_frozen(step)` says whether the
    policy update is skipped this step (CLIPO's head warm-up); `state_json` / `load_state` put the stage's state
    into checkpoints so a resumed run continues exactly.
    """

    name: str

    def __call__(self, params, rollout, key) -> tuple[np.ndarray, dict[str, float]]: ...

    def actor_frozen(self, step: int) -> bool: ...

    def state_json(self) -> Any: ...

    def load_state(self, data: Any) -> None: ...


# (run, settings) -> Shaper; built once at setup.
ShaperFactory = Callable[[Any, AlgoSettings], Shaper]
# (first rollout, collect(round) -> rollout, settings) -> (rollout, metrics)
ResampleFn = Callable[[Any, Callable[[int], Any], AlgoSettings], tuple[Any, dict[str, float]]]
# (records, tokenizer, prompt_width, completion_width) -> TrainBatch of expert rows
ExtraRowsFn = Callable[[list, Any, int, int], Any]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One RL method.

    Attributes:
      name: the `algorithm.name` that selects it.
      advantages: rewards -> per-token advantages and clip bounds (`AdvantageFn`).
      per_reward: the estimator normalises each reward column separately (GDPO, GD²PO); a KL penalty in the
        reward would then be normalised like a task reward, so the config refuses `kl.where: reward`.
      shaper: optional reward-shaping stage factory (CLIPO).
      resample: optional resampling stage (DAPO dynamic sampling).
      extra_rows: optional expert rows appended to the batch (AFRL SFT-aux).
      loss: settings -> `LossSpec` field overrides (e.g. `{"sft_lambda": λ}`).
      min_group: the smallest group its estimator defines (RLOO's leave-one-out baseline needs 2; GRPO's
        group of 1 is verl's A = R).
      critic: the method learns a value model (PPO): `advantages` then gives the per-token rewards r_t, and the
        run's critic turns them into advantages (`jaxrl.rl.critic.ActorCritic`, chosen at setup).
      params: the dataclass of its own hyper-parameters (every field with a default), set in a config under
        `algorithm.params` and checked at load like every other section (unknown keys, types, the class's
        `__post_init__`); its stages read the instance as `AlgoSettings.params`. None: it takes none.
      task_columns: (params, reward names) -> the reward columns that score the task, when its parameters
        choose them (DAPO's `filter_rewards`; None from it, or no function: every reward but length shaping).
    """

    name: str
    advantages: AdvantageFn
    per_reward: bool = False
    shaper: ShaperFactory | None = None
    resample: ResampleFn | None = None
    extra_rows: ExtraRowsFn | None = None
    loss: Callable[[AlgoSettings], dict[str, Any]] = lambda s: {}
    min_group: int = 1
    critic: bool = False
    params: type | None = None
    task_columns: Callable[[Any, tuple[str, ...]], tuple[int, ...] | None] | None = None


def combined_reward(rewards_BR: np.ndarray, weights_R: np.ndarray) -> np.ndarray:
    """Weighted sum over rewards; NaN (a skipped reward) stays NaN so the estimator can exclude the sample."""
    return (rewards_BR * weights_R[None, :]).sum(axis=1).astype(np.float32)


def task_reward(rewards_BR: np.ndarray, weights_R: np.ndarray, s: AlgoSettings) -> np.ndarray:
    """The weighted sum of the task columns per sample, skipped (NaN) rewards counted as 0."""
    cols = list(s.task_columns) or list(range(rewards_BR.shape[1]))
    return combined_reward(np.nan_to_num(rewards_BR[:, cols]), np.asarray(weights_R)[cols])


def sequence_advantages(adv_B, mask_BT, s: AlgoSettings, metrics=None) -> Advantages:
    """Broadcasts one advantage per sample over its completion tokens, with the constant clip bounds."""
    adv_B = np.asarray(adv_B, np.float32)
    n = adv_B.shape[0]
    return Advantages(
        adv_BT=adv_B[:, None] * np.asarray(mask_BT, np.float32),
        clip_low_B=np.full((n,), s.clip_low, np.float32),
        clip_high_B=np.full((n,), s.clip_high, np.float32),
        metrics=dict(metrics or {}),
    )


def segment_advantages(fn: AdvantageFn, rewards_BR: np.ndarray, weights_R: np.ndarray, mask_BT: np.ndarray,
                       s: AlgoSettings, segment_B: np.ndarray | None, sizes: tuple[int, ...],
                       estimators: Sequence[AdvantageFn | None] = ()) -> Advantages:
    """`fn` on each segment of the rows (a multi-agent system's roles) with that segment's group size.

    Advantages are never normalised across segments (spec/multi-agent.md §3.8): a batch-level statistic
    (GDPO's batch standardisation) is taken within a segment. Metrics are row-weighted means over the
    segments that report them. `segment_B` None: `fn` on all rows with the run's group size.
    `estimators`: per segment id, an estimator that replaces `fn` on that segment's rows (None: `fn`), e.g.
    RLOO for one role and GRPO for the others (`multi_agent.estimators`).
    """
    if segment_B is None:
        return fn(rewards_BR, weights_R, mask_BT, s)
    mask_BT = np.asarray(mask_BT)
    n, t = mask_BT.shape
    adv_BT = np.zeros((n, t), np.float32)
    low_B, high_B = np.zeros((n,), np.float32), np.zeros((n,), np.float32)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for seg in np.unique(segment_B):
        rows = np.flatnonzero(segment_B == seg)
        own = estimators[seg] if seg < len(estimators) else None
        out = (own or fn)(rewards_BR[rows], weights_R, mask_BT[rows],
                          dataclasses.replace(s, group_size=int(sizes[seg])))
        adv_BT[rows], low_B[rows], high_B[rows] = out.adv_BT, out.clip_low_B, out.clip_high_B
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(rows)
            counts[k] = counts.get(k, 0) + len(rows)
    return Advantages(adv_BT, low_B, high_B, {k: sums[k] / counts[k] for k in sums})


def zero_std_group_frac(total_B: np.ndarray, group_size: int, segment_B: np.ndarray | None,
                        sizes: tuple[int, ...]) -> float:
    """The fraction of groups whose rewards are all equal (no GRPO signal); groups of one row are not
    counted (they have no spread to lose). NaN when there is no group of two or more."""
    if segment_B is None:
        segment_B, sizes = np.zeros(len(total_B), np.int32), (group_size,)
    flat: list[bool] = []
    for seg in np.unique(segment_B):
        g = int(sizes[seg])
        if g > 1:
            flat += list(total_B[segment_B == seg].reshape(-1, g).std(axis=1) == 0)
    return float(np.mean(flat)) if flat else float("nan")
