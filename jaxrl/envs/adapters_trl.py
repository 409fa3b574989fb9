"""`TRLToolEnv`: TRL's `environment_factory` convention as a `jaxrl.envs.Env` (`env.name: trl`).

TRL's GRPOTrainer (`environment_factory=`) takes a zero-argument factory; the object it returns has
  - `reset(**row)`: called with the dataset row's fields; returns None or a string appended to the last user
    message of the prompt;
  - public methods (no leading "_", other than `reset` / `get_reward`): the tools the model may call, each
    with type hints and a Google-style docstring (their JSON schemas are shown to the model);
  - optionally `get_reward()`: the environment's own reward, read once per finished rollout.
Other rewards come from the trainer's reward functions on the completion. Config:

    env:
      name: trl
      params: {env: "my_pkg.envs:WordleEnv"}     # the factory (a class or a function)
      max_turns: 6
    rewards: [{name: correct, type: exact_answer}]

How the pieces map:
  record   -> `reset(**row)`: the record's fields as keyword arguments, as TRL passes the dataset row (without
              the token ids jaxrl's data encoder adds).
  prompt   -> the record's `prompt` (text, or chat messages) with reset's string appended to its last user
              message, rendered by the chat template with `tools=` the methods' JSON schemas (as TRL renders
              it). A template that ignores `tools` (jaxrl's built-in one) gets the schemas and the call format
              in the system message instead.
  action   -> tool calls in the Qwen/Hermes format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
              ("</tool_call>" is a stop string, so a turn ends at its call). Each call runs
              `method(**arguments)`; a turn without a call is the final answer and ends the episode.
  obs      -> each result `str(result)` as a tool message (role `tool_role`), all of a turn's results rendered
              once after the assistant turn (`messages_ids`). A failing call (unknown tool, bad JSON or
              arguments, the method raised) gives `{'error': '...'}` as its result and counts in tool_errors,
              as in TRL; it never ends the run.
  reward   -> column 0 (the episode return) is `get_reward()` after the last step, given as its change per
              turn, so the return equals it however the episode ends (answer, EOS, or cut by env.max_turns);
              0 without `get_reward`. The run's `rewards:` score the transcript, whose last part is the final
              answer (TRL's reward functions; their `environments=` argument has no counterpart here).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any, Mapping

from jaxrl.envs.adapters import (call_env, chat, construct, dataset_row, expect_messages, expect_reward, expect_text,
                                 messages_ids, require_methods, resolve)
from jaxrl.envs.base import Action, StepResult, encode_text
from jaxrl.errors import ConfigError

API = "TRL's environment_factory needs an object with reset(**row) and public tool methods"
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
RESERVED = ("reset", "get_reward")
CALL_FORMAT = ('To call a tool, write <tool_call>{"name": <tool name>, "arguments": {<argument>: <value>}}'
               "</tool_call>. Reply without a call to give your final answer.")


def tool_methods(instance: Any) -> dict[str, Any]:
    """name -> bound method of the public functions of `type(instance)` except reset / get_reward (TRL lists
    the class's functions, so properties are never evaluated)."""
    return {name: getattr(instance, name) for name, _ in inspect.getmembers(type(instance), inspect.isfunction)
            if name not in RESERVED and not name.startswith("_")}


def tool_schemas(tools: Mapping[str, Any], label: str) -> list[dict[str, Any]]:
    """The JSON schemas of the tools (transformers' `get_json_schema`, what chat templates render)."""
    from transformers.utils import get_json_schema

    out = []
    for name, fn in tools.items():
        try:
            out.append(get_json_schema(fn))
        except Exception as e:  # noqa: BLE001 -- DocstringParsingException, TypeHintParsingException
            raise ConfigError(f"{label}: tool {name!r} cannot be described to the model ({type(e).__name__}: "
                              f"{e}); TRL's tools need type hints and a Google-style docstring") from None
    return out


def _resolved(value: Any) -> Any:
    """An async tool's (or get_reward's) result awaited; a plain value as it is."""
    return asyncio.run(value) if inspect.isawaitable(value) else value


class TRLToolEnv:
    """An environment in TRL's `environment_factory` convention (module docstring).

    Args:
      tokenizer: the model's tokenizer.
      env: "package.module:attr" or "path/file.py:attr": the factory (a class or a zero-argument function).
      kwargs: keyword arguments of the factory (TRL calls it without any; empty by default).
      system: an optional system message.
      tool_role: the role of tool-result messages ("tool"; a template without a tool role, such as jaxrl's
        built-in one, renders unknown roles as assistant turns: use "user" there).
    """

    stop_strings = ("</tool_call>",)

    def __init__(self, tokenizer, *, env: str, kwargs: Mapping[str, Any] | None = None,
                 system: str | None = None, tool_role: str = "tool"):
        self.label = f"trl env {env!r}"
        self.env = construct(resolve(str(env), "env.params.env"), self.label, **dict(kwargs or {}))
        require_methods(self.env, ("reset",), self.label, API)
        self.tools = tool_methods(self.env)
        self.schemas = tool_schemas(self.tools, self.label)
        self.tokenizer, self.system, self.tool_role = tokenizer, system, str(tool_role)
        self.has_reward = callable(getattr(type(self.env), "get_reward", None))
        self.template_tools = self._template_renders_tools()
        self.turn, self.reward_so_far = 0, 0.0

    def _template_renders_tools(self) -> bool:
        """Whether the chat template shows the tools (rendering with and without them differs)."""
        if not self.schemas:
            return True
        probe = [{"role": "user", "content": "x"}]
        return self._render(probe, True) != self._render(probe, False)

    def _render(self, messages: list[dict[str, str]], tools: bool) -> str:
        kwargs = {"tools": self.schemas} if tools and self.schemas else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        """`reset(**record)`; the prompt with its string appended to the last user message, tools rendered."""
        self.turn, self.reward_so_far = 0, 0.0
        extra = call_env(self.label, "reset", 0, self.env.reset, **dataset_row(record))
        extra = "" if extra is None else expect_text(extra, self.label, "reset", 0, "a value")
        prompt = record.get("prompt", "")
        messages = chat(None, prompt) if isinstance(prompt, str) else \
            expect_messages(prompt, self.label, "reset", 0, "got a record whose prompt has messages")
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + extra}
        system = self.system
        if not self.template_tools:  # the schemas and the call format in the system message
            listing = "\n".join(json.dumps(s, separators=(",", ":")) for s in self.schemas)
            system = "\n".join(x for x in (system, f"Tools:\n{listing}", CALL_FORMAT) if x)
        if system and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system}, *messages]
        return encode_text(self.tokenizer, self._render(messages, self.template_tools))

    def step(self, action: Action) -> StepResult:
        """Runs the turn's tool calls and returns their results as tool messages; no call ends the episode."""
        self.turn += 1
        calls = CALL.findall(action.text)
        results = [self._call(c) for c in calls]
        reward = self._reward_change()
        if not calls:
            return StepResult([], reward, True, {"tool_calls": 0, "tool_errors": 0})
        info = {"tool_calls": len(calls), "tool_errors": sum(not ok for ok, _ in results)}
        messages = [{"role": self.tool_role, "content": text} for _, text in results]
        return StepResult(messages_ids(self.tokenizer, messages), reward, False, info)

    def _call(self, body: str) -> tuple[bool, str]:
        """(ok, result text) of one `<tool_call>` body: `str(result)`, or `{'error': ...}` as TRL gives."""
        try:
            call = json.loads(body)
            name, args = call["name"], call.get("arguments", {})
            args = json.loads(args) if isinstance(args, str) else args
            if name not in self.tools:
                raise ValueError(f"Tool {name} not found.")
            if not isinstance(args, dict):
                raise ValueError(f"arguments must be an object, got {args!r:.40}")
            return True, str(_resolved(self.tools[name](**args)))
        except Exception as e:  # noqa: BLE001 -- the model's call failed: the error is its result
            return False, str({"error": str(e) or type(e).__name__})

    def _reward_change(self) -> float:
        """get_reward() now minus its value after the previous turn (0 without get_reward)."""
        if not self.has_reward:
            return 0.0
        value = call_env(self.label, "get_reward", self.turn, lambda: _resolved(self.env.get_reward()))
        value = expect_reward(value, self.label, "get_reward", self.turn)
        change, self.reward_so_far = value - self.reward_so_far, value
        return change
