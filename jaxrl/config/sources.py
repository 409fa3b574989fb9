"""The sections that say where a run's rows come from: `data:`, `rollout:`, `rewards:`, `env:`, `multi_agent:`."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl._checks import check as _check, check_choice as _check_choice


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Prompt source: `arithmetic` / `countdown` (built-in), `reasoning_gym:<task>`, or a .jsonl/.parquet
    path.

    `prompts_per_step` is the global number of prompts per RL step (split over hosts); `eval_size` prompts are
    held out; `target_format` turns a reference answer into the SFT target (warm start, sft_aux), or, when
    `target_formats` is given, each record's target uses one of those styles, picked by a hash of its prompt
    and the warm-start step (demonstrations in mixed styles); `params` go to the built-in generator or reasoning-gym.
    """

    source: str = "arithmetic"
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    prompts_per_step: int = 8
    train_size: int = 20000
    eval_size: int = 64
    system_prompt: str | None = None
    target_format: str = "<answer>{answer}</answer>"
    target_formats: tuple[str, ...] = ()
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    on_long_prompt: str = "error"  # a prompt longer than the rollout can take: "error" (exit 2) or "drop" it

    def __post_init__(self):
        _check(bool(self.source), "data.source", self.source, "must name a generator or a file")
        _check_choice("data.on_long_prompt", self.on_long_prompt, ("error", "drop"))
        for name in ("prompts_per_step", "train_size"):
            _check(getattr(self, name) >= 1, f"data.{name}", getattr(self, name), "must be >= 1")
        _check(self.eval_size >= 0, "data.eval_size", self.eval_size, "must be >= 0")
        for key, fmt in [("data.target_format", self.target_format)] + [
            (f"data.target_formats[{i}]", f) for i, f in enumerate(self.target_formats)
        ]:
            _check(
                "{answer}" in fmt,
                key,
                fmt,
                "must contain the placeholder {answer} (the SFT target is the answer in the expected format)",
            )


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """`rollout.engine`: how rows are decoded (`jaxrl.sampling`). `static` (default): every row keeps its row
    of the batch until the longest ends. `continuous`: `slots` decode slots; a row that stops (EOS or length)
    hands its slot to the next pending row (`jaxrl.sampling.continuous`). The same tokens and log-probs for
    a seed; continuous pays when completion lengths are long-tailed (benchmarks/RESULTS.md, "Continuous
    batching"). `slots` null: one per row (no refill). At least 2 slots per batch shard of the sampler: XLA:CPU
    compiles a one-row decode step's fusions unlike a several-row one's (seen at -O1 on an Intel Xeon), so one
    slot per device would round log-probs unlike the static batch. Held-out evaluation decodes with the static
    engine. With `env:` each slot holds one episode and its KV cache across its turns, a finished episode's slot
    taken by the next (`jaxrl.envs.slot_episodes`): the tokens of the static engine with `cache: continue`,
    log-probs equal to float rounding; on several processes each host admits its own episodes into the slots its
    devices own. Not with `multi_agent:`."""

    kind: str = "static"
    slots: int | None = None

    def __post_init__(self):
        _check_choice("rollout.engine.kind", self.kind, ("static", "continuous"))
        if self.slots is not None:
            _check(self.kind == "continuous", "rollout.engine.slots", self.slots,
                   "is the continuous engine's (set rollout.engine.kind: continuous, or slots: null)")
            _check(self.slots >= 2, "rollout.engine.slots", self.slots,
                   "must be >= 2 (or null: one per row); a single decode row rounds unlike the static batch's")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Sampling of `group_size` completions per prompt; lengths are padded up to the nearest bucket."""

    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    prompt_buckets: tuple[int, ...] = (32, 64, 128, 256, 512)
    gen_buckets: tuple[int, ...] = ()
    logprobs_from_sampler: bool = False
    engine: EngineConfig = EngineConfig()

    def __post_init__(self):
        _check(self.group_size >= 1, "rollout.group_size", self.group_size, "must be >= 1")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "must be >= 1")
        _check(self.temperature > 0, "rollout.temperature", self.temperature, "must be > 0")
        if self.top_k is not None:
            _check(self.top_k >= 1, "rollout.top_k", self.top_k, "must be >= 1 or null")
        if self.top_p is not None:
            _check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "must be in (0, 1] or null")
        for name in ("prompt_buckets", "gen_buckets"):
            b = getattr(self, name)
            _check(
                all(x >= 1 for x in b) and list(b) == sorted(set(b)),
                f"rollout.{name}",
                list(b),
                "must be strictly increasing positive integers",
            )


@dataclasses.dataclass(frozen=True)
class RewardSpec:
    """One reward: a built-in `type` (see `jaxrl.rewards.BUILTINS`) or `type: function` with `function:
    "module:function"`. `on_error`: 'zero' scores a failing call 0, 'skip' scores it NaN (excluded)."""

    name: str
    type: str = "function"
    weight: float = 1.0
    function: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    on_error: str = "zero"

    def __post_init__(self):
        _check(
            bool(self.name) and "/" not in self.name,
            "rewards.name",
            self.name,
            "a reward needs a non-empty name without '/'",
        )
        _check_choice(f"rewards[{self.name}].on_error", self.on_error, ("zero", "skip"))
        if self.type == "function":
            f = self.function or ""
            _check(
                f.count(":") == 1 and all(f.split(":")),
                f"rewards[{self.name}].function",
                self.function,
                "type 'function' needs function: 'package.module:function_name'",
            )


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """A multi-turn environment (`jaxrl.envs`): `name` is a built-in (`search`, `tools`; the adapters `gym`,
    `skyrl`, `trl` of other libraries' env APIs), "package.module:Class" or "path/file.py:Class"; `params` go
    to its constructor (checked against its signature at setup). Each
    episode has at most `max_turns` model turns of `rollout.max_new_tokens` tokens and `max_total_tokens` of
    context; `cache` is "reprefill" (rebuild the KV cache every turn) or "continue" (prefill only the new
    observation tokens). The episode return is reward column 0; `rewards:` add columns scored on the transcript.
    A step that breaks the `Env` contract, raises or runs past `step_timeout_s` seconds (null: no limit):
    with `on_error` "raise" the run stops (exit 2, one line); with "end_episode" that episode scores 0
    (`env/errors`), and an environment failing every episode for `train.max_failed_reward_steps` steps stops
    it (exit 2)."""

    name: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int = 4
    max_total_tokens: int = 512
    cache: str = "reprefill"
    on_error: str = "raise"
    step_timeout_s: float | None = None

    def __post_init__(self):
        _check(bool(self.name), "env.name", self.name, "must name an environment")
        _check(self.max_turns >= 1, "env.max_turns", self.max_turns, "must be >= 1")
        _check(self.max_total_tokens >= 1, "env.max_total_tokens", self.max_total_tokens, "must be >= 1")
        _check_choice("env.cache", self.cache, ("reprefill", "continue"))
        _check_choice("env.on_error", self.on_error, ("raise", "end_episode"))
        _check(self.step_timeout_s is None or self.step_timeout_s > 0, "env.step_timeout_s",
               self.step_timeout_s, "must be > 0 seconds, or null for no limit")


@dataclasses.dataclass(frozen=True)
class MultiAgentConfig:
    """A multi-agent system played by the one policy (`jaxrl.multi_agent`): `system` is a built-in (`march`),
    `params` go to its constructor (checked at setup). It replaces the collect stage; the SFT warm start
    trains on its role-format demonstrations. `adapters`: "shared" (every role samples and trains the one
    policy) or "per_role" (with `model.lora`: one adapter set and optimiser state per role over the shared
    frozen base, `jaxrl.multi_agent.adapters`). `estimators`: role -> the advantage estimator of that role's
    rows instead of `algorithm.name`'s (an estimator-only algorithm: grpo, dr_grpo, rloo, gdpo, gd2po, etr),
    e.g. `{solver: rloo}`; each role's estimator runs on its own rows with its own group size."""

    system: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    adapters: str = "shared"
    estimators: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _check(bool(self.system), "multi_agent.system", self.system, "must name a system")
        _check_choice("multi_agent.adapters", self.adapters, ("shared", "per_role"))

