"""`GymTextEnv`: a gymnasium-style text environment as a `jaxrl.envs.Env` (`env.name: gym`).

The wrapped env follows gymnasium's API with text observations and actions:

    reset(seed=None, options=None) -> (observation: str, info: dict)
    step(action: str)              -> (observation: str, reward, terminated, truncated, info)

Config:

    env:
      name: gym
      params: {env: "my_pkg.envs:make_text_env", kwargs: {size: 4}, stop_strings: ["</move>"]}
      max_turns: 8

How the pieces map:
  record   -> `reset(seed=record[seed_field] or a crc32 of the record, options=record)`: the dataset row reaches
              the env as `options` (gymnasium's channel for per-episode settings; without the token ids jaxrl's
              data encoder adds), and the seed is a function of the record so the G episodes of one record
              start alike.
  prompt   -> the chat template over [system?, user: instructions + first observation] (`prompt_ids`).
  action   -> the model's turn as text (its decoded sampled tokens) is `step`'s action.
  obs      -> each later observation is a "user" message (`message_ids`, obs_format "message") or text inlined
              into the assistant turn (`encode_text`, obs_format "inline"); rendered once, never trained on.
  reward   -> the turn's reward; done = terminated or truncated (info["truncated"] says which; the env is
              then closed). The final observation is not fed (nothing follows it); it is kept in
              info["final_observation"].

A gymnasium env with non-text observations (FrozenLake's int state, say) is refused at the first reset with
one line; wrap it in a `gymnasium.ObservationWrapper` / `gymnasium.Wrapper` that renders text and parses the
action text. No import of gymnasium is needed here: the API is duck-typed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxrl.envs.adapters import (call_env, chat, construct, dataset_row, expect_reward, expect_text,
                                 require_methods, resolve, stable_seed, string_tuple)
from jaxrl.envs.base import Action, StepResult, encode_text, message_ids, prompt_ids
from jaxrl.errors import EnvError

OBS_FORMATS = ("message", "inline")
API = "a gymnasium text env needs reset(seed=, options=) -> (str, info) and step(str) -> 5-tuple"
TEXT_HINT = " (wrap a non-text env in a gymnasium.Wrapper that renders its observations as text)"


class GymTextEnv:
    """A gymnasium-style text env (module docstring).

    Args:
      tokenizer: the model's tokenizer.
      env: "package.module:attr" or "path/file.py:attr": a gymnasium env class or a factory returning one.
      kwargs: keyword arguments of that class / factory.
      instructions: text put before the first observation in the user message.
      system: an optional system message.
      stop_strings: strings that end a model turn (EOS always does).
      obs_format: "message" (a user message per observation) or "inline" (text in the assistant turn).
      seed_field: the record field holding reset's seed; absent: a crc32 of the record.
    """

    def __init__(self, tokenizer, *, env: str, kwargs: Mapping[str, Any] | None = None, instructions: str = "",
                 system: str | None = None, stop_strings: Sequence[str] = (), obs_format: str = "message",
                 seed_field: str = "seed"):
        if obs_format not in OBS_FORMATS:
            raise ValueError(f"obs_format={obs_format!r}: allowed values are {', '.join(map(repr, OBS_FORMATS))}")
        self.label = f"gym env {env!r}"
        factory = resolve(str(env), "env.params.env")
        if isinstance(factory, type):  # a class: check its API before constructing it
            require_methods(factory, ("reset", "step"), self.label, API)
        self.env = construct(factory, self.label, **dict(kwargs or {}))
        require_methods(self.env, ("reset", "step"), self.label, API)
        self.tokenizer, self.instructions, self.system = tokenizer, str(instructions), system
        self.stop_strings = string_tuple(stop_strings, "stop_strings")
        self.obs_format, self.seed_field, self.turn = obs_format, str(seed_field), 0

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        """`reset(seed=…, options=record)`; the prompt is [system?, user: instructions + observation]."""
        self.turn, row = 0, dataset_row(record)
        seed = row[self.seed_field] if self.seed_field in row else stable_seed(row)
        out = call_env(self.label, "reset", 0, self.env.reset, seed=int(seed), options=row)
        obs, _ = self._pair(out)
        obs = expect_text(obs, self.label, "reset", 0, "an observation", TEXT_HINT)
        return prompt_ids(self.tokenizer, chat(self.system, self.instructions + obs))

    def step(self, action: Action) -> StepResult:
        """One gymnasium step on the action text; the next observation as ids unless the episode ended."""
        self.turn += 1
        out = call_env(self.label, "step", self.turn, self.env.step, action.text)
        if not isinstance(out, tuple) or len(out) != 5:
            raise EnvError(f"{self.label}: step (turn {self.turn}) returned {out!r:.80}; expected "
                           "(observation, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, info = out
        obs = expect_text(obs, self.label, "step", self.turn, "an observation", TEXT_HINT)
        reward = expect_reward(reward, self.label, "step", self.turn)
        done = bool(terminated) or bool(truncated)
        info = {**(info if isinstance(info, Mapping) else {}), "truncated": bool(truncated)}
        if done:
            if callable(getattr(self.env, "close", None)):
                call_env(self.label, "close", self.turn, self.env.close)
            return StepResult([], reward, True, {**info, "final_observation": obs})
        return StepResult(self._ids(obs), reward, False, info)

    def _pair(self, out: Any) -> tuple[Any, Any]:
        """reset's (observation, info); a bare observation (the old gym API) is refused with one line."""
        if not isinstance(out, tuple) or len(out) != 2:
            raise EnvError(f"{self.label}: reset returned {out!r:.80}; expected (observation, info) as "
                           "gymnasium's reset does")
        return out

    def _ids(self, text: str) -> list[int]:
        if self.obs_format == "inline":
            return encode_text(self.tokenizer, text)
        return message_ids(self.tokenizer, "user", text)
