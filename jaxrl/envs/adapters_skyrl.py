"""`SkyRLTextEnv`: a skyrl-gym `BaseTextEnv` as a `jaxrl.envs.Env` (`env.name: skyrl`).

skyrl-gym's text envs are built per episode as `EnvClass(env_config=..., extras=...)`, where `extras` holds
the dataset row's fields (`reward_spec`, `extra_info`, ...), and speak chat messages:

    init(prompt: list[message]) -> (messages, metadata)
    step(action: str)           -> {"observations": list[message], "reward", "done", "metadata",
                                    "postprocessed_action"?}

Config (`env` is a skyrl-gym registry id such as "gsm8k", or "package.module:Class" / "path/file.py:Class"):

    env:
      name: skyrl
      params: {env: gsm8k_multi_turn, extras: {max_turns: 2}, system: "Answer as '#### <number>'."}

How the pieces map:
  record   -> extras: the record's fields except `prompt` (and skyrl's `env_class`), over `params.extras`;
              when the record has no `reward_spec`, its `answer` becomes {"method": "rule", "ground_truth":
              answer}, so jaxrl's data sources (`answer` field) drive skyrl's rule-based envs as they are.
              The prompt is the record's `prompt`: a list of chat messages as skyrl datasets hold, or text
              (a user message, after `system` when given). `init(prompt)` may rewrite it.
  prompt   -> the chat template over init's messages (`prompt_ids`).
  action   -> the model's turn as text. skyrl's `postprocessed_action` (a rewritten action) is kept in info
              only: the trained row holds the tokens the model sampled, never a re-rendering.
  obs      -> step's observations (chat messages), rendered once after the assistant turn (`messages_ids`).
  reward   -> the turn's reward; done -> done (then `close()` is called). The episode ends at jaxrl's
              env.max_turns at the latest, whatever the skyrl env's own `max_turns` says.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxrl._imports import is_reference
from jaxrl.envs.adapters import (call_env, chat, dataset_row, expect_messages, expect_reward, messages_ids, require_methods,
                                 resolve, string_tuple)
from jaxrl.envs.base import Action, StepResult, prompt_ids
from jaxrl.errors import ConfigError, EnvError

API = "a skyrl-gym text env (skyrl_gym.envs.base_text_env.BaseTextEnv) needs init(prompt) and step(action)"
_NOT_EXTRAS = ("prompt", "env_class")


def _registered(env_id: str, label: str):
    """The class of skyrl-gym's registered env `env_id` (e.g. "gsm8k"); ConfigError when skyrl-gym is missing
    or does not know the id."""
    try:
        import skyrl_gym
        from skyrl_gym.envs.registration import load_env_creator
    except ImportError:
        raise ConfigError(f"{label}: skyrl-gym is not installed (pip install 'jaxrl[skyrl]'), or name the env "
                          "as 'package.module:Class'") from None
    if env_id not in skyrl_gym.registry:
        known = ", ".join(sorted(skyrl_gym.registry))
        raise ConfigError(f"{label}: not a registered skyrl-gym env (registered: {known}; or "
                          "'package.module:Class')")
    entry = skyrl_gym.registry[env_id].entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def _env_config(values: Mapping[str, Any]) -> Any:
    """skyrl passes env_config as an OmegaConf DictConfig (attribute access); a dict where OmegaConf is
    absent."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return dict(values)
    return OmegaConf.create(dict(values))


class SkyRLTextEnv:
    """A skyrl-gym text env (module docstring).

    Args:
      tokenizer: the model's tokenizer.
      env: a skyrl-gym registry id ("gsm8k", "gsm8k_multi_turn", ...), or "package.module:Class" /
        "path/file.py:Class" of a `BaseTextEnv` subclass.
      env_config: the env's `env_config` (given as an OmegaConf DictConfig, as skyrl does).
      extras: defaults for every episode's `extras` (the record's fields override them).
      system: a system message put before a text prompt.
      stop_strings: strings that end a model turn (EOS always does).
    """

    def __init__(self, tokenizer, *, env: str, env_config: Mapping[str, Any] | None = None,
                 extras: Mapping[str, Any] | None = None, system: str | None = None,
                 stop_strings: Sequence[str] = ()):
        self.label = f"skyrl env {env!r}"
        ref = str(env)
        self.cls = resolve(ref, "env.params.env") if is_reference(ref) else _registered(ref, self.label)
        require_methods(self.cls, ("init", "step"), self.label, API)
        self.tokenizer, self.system = tokenizer, system
        self.env_config, self.extras = _env_config(env_config or {}), dict(extras or {})
        self.stop_strings = string_tuple(stop_strings, "stop_strings")
        self.env, self.turn = None, 0

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        """Builds the env for this record (extras from its fields) and returns init's messages as the prompt."""
        self.turn = 0
        extras = {**self.extras, **{k: v for k, v in dataset_row(record).items() if k not in _NOT_EXTRAS}}
        if "reward_spec" not in extras and "answer" in record:
            extras["reward_spec"] = {"method": "rule", "ground_truth": str(record["answer"])}
        self.env = call_env(self.label, "__init__", 0, self.cls, env_config=self.env_config, extras=extras)
        prompt = record.get("prompt", "")
        messages = chat(self.system, prompt) if isinstance(prompt, str) else \
            expect_messages(prompt, self.label, "reset", 0, "got a record whose prompt has messages")
        out = call_env(self.label, "init", 0, self.env.init, messages)
        if not isinstance(out, tuple) or len(out) != 2:
            raise EnvError(f"{self.label}: init returned {out!r:.80}; expected (messages, metadata)")
        return prompt_ids(self.tokenizer, expect_messages(out[0], self.label, "init", 0))

    def step(self, action: Action) -> StepResult:
        """One skyrl step on the action text; its observation messages as ids unless the episode ended."""
        self.turn += 1
        out = call_env(self.label, "step", self.turn, self.env.step, action.text)
        if not isinstance(out, Mapping) or not {"observations", "reward", "done"} <= set(out):
            raise EnvError(f"{self.label}: step (turn {self.turn}) returned {out!r:.80}; expected a dict with "
                           "observations, reward, done (skyrl's BaseTextEnvStepOutput)")
        messages = expect_messages(out["observations"], self.label, "step", self.turn)
        reward = expect_reward(out["reward"], self.label, "step", self.turn)
        done = bool(out["done"])
        info = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        if done and callable(getattr(self.env, "close", None)):
            call_env(self.label, "close", self.turn, self.env.close)
        if done:
            return StepResult([], reward, True, info)
        obs = messages_ids(self.tokenizer, messages) if messages else []
        return StepResult(obs, reward, False, info)
