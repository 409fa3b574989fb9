"""Adapters: environments written for other libraries' APIs run under `env:` unchanged.

Three adapters, each a `jaxrl.envs.Env` registered in `ENVS` under a short name; `env.params.env` names the
wrapped environment ("package.module:attr" or "path/file.py:attr", resolved as the registry resolves
`env.name`):

    gym    `GymTextEnv` (adapters_gym.py): gymnasium-style text envs, `reset(seed, options) -> (str, info)`,
           `step(str) -> (str, reward, terminated, truncated, info)`
    skyrl  `SkyRLTextEnv` (adapters_skyrl.py): skyrl-gym `BaseTextEnv`s, `init(messages)`, `step(str) ->
           {observations, reward, done, metadata}` (a skyrl-gym registry id such as "gsm8k" works too)
    trl    `TRLToolEnv` (adapters_trl.py): TRL's `environment_factory` convention: a zero-argument factory of
           an object whose public methods are the tools, `reset(**record)`, optional `get_reward()`

Every adapter turns the wrapped env's text into token ids exactly once, when it is appended (`prompt_ids` for
the first messages, `message_ids` / `messages_ids` for chat messages, `encode_text` for inline text), and the
model's action text (the decoded sampled ids) into the wrapped env's action; rewards and done map through.
The training row therefore stays the concatenation prompt | a_1 | o_1 | … that `jaxrl.envs.episodes` builds.

Errors: a wrapped object without the API's methods is a `ConfigError` at setup naming the missing methods;
a wrapped env that raises, or returns the wrong types, is an `EnvError` naming the adapter, the wrapped env,
the method and the turn (one line; `env.on_error: end_episode` ends only that episode instead).
"""

from __future__ import annotations

import functools
import json
import traceback
import zlib
from typing import Any, Callable, Mapping, Sequence

from jaxrl._imports import import_attr
from jaxrl.envs.base import _SENTINEL, encode_text, message_ids
from jaxrl.errors import ConfigError, EnvError

ENCODER_FIELDS = ("prompt_ids", "sft_target", "target_ids")  # added by jaxrl.data.pipeline.Encoder


def dataset_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as the dataset row it came from: without the token ids and SFT target that jaxrl's encoder
    adds (a wrapped env's reset(**row) would not expect them)."""
    return {k: v for k, v in record.items() if k not in ENCODER_FIELDS}


@functools.lru_cache(maxsize=32)
def resolve(ref: str, where: str) -> Any:
    """The callable `ref` names ("module:attr" or "path/file.py:attr"), imported once per process (a file
    path would otherwise be executed again for every episode)."""
    return import_attr(ref, where, kind="class or factory", accept=callable)


def missing_methods(obj: Any, names: Sequence[str]) -> list[str]:
    """The names in `names` that are not callable attributes of `obj` (a class or an instance)."""
    return [n for n in names if not callable(getattr(obj, n, None))]


def require_methods(obj: Any, names: Sequence[str], label: str, api: str) -> None:
    """ConfigError naming the missing methods unless `obj` has every one of `names`."""
    missing = missing_methods(obj, names)
    if missing:
        what = getattr(obj, "__name__", type(obj).__name__)
        raise ConfigError(f"{label}: {what} lacks {', '.join(missing)}; {api}")


def construct(factory: Callable[..., Any], label: str, **kwargs: Any) -> Any:
    """`factory(**kwargs)`; anything it raises becomes one ConfigError line naming the wrapped env."""
    try:
        return factory(**kwargs)
    except (ConfigError, EnvError):
        raise
    except Exception as e:  # noqa: BLE001 -- user code: one line naming it
        raise ConfigError(f"{label}: constructing it raised {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    """`Type: first line of the message at file:line` of an exception (the frame that raised it)."""
    frames = traceback.extract_tb(e.__traceback__)
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}{': ' + text[0] if text else ''}{at}"


def call_env(label: str, method: str, turn: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, a wrapped env's method; anything it raises is one EnvError line naming the env,
    the method, the turn (0: before the first turn, left out of the line) and where it was raised."""
    try:
        return fn(*args, **kwargs)
    except EnvError:
        raise
    except Exception as e:  # noqa: BLE001 -- user code: one line naming it
        raise EnvError(f"{_where(label, method, turn)} raised {_one_line(e)}") from None


def _where(label: str, method: str, turn: int) -> str:
    """"gym env 'm:E': step (turn 2)"; turn 0 (reset, init, construction) is left out."""
    return f"{label}: {method}" + (f" (turn {turn})" if turn else "")


def _kind(x: Any) -> str:
    return "None" if x is None else f"a {type(x).__name__}"


def expect_text(value: Any, label: str, method: str, turn: int, what: str, hint: str = "") -> str:
    """`value` if it is a str; an EnvError naming the env, method and turn otherwise (then `hint`)."""
    if not isinstance(value, str):
        raise EnvError(f"{_where(label, method, turn)} returned {what} that is {_kind(value)} "
                       f"({value!r:.60}); expected a str{hint}")
    return value


def expect_reward(value: Any, label: str, method: str, turn: int) -> float:
    """`value` as a float (ints, floats, numpy scalars, bools); an EnvError naming the env otherwise."""
    try:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise EnvError(f"{_where(label, method, turn)} returned a reward that is {_kind(value)} "
                       f"({value!r:.60}); expected a number") from None


def expect_messages(value: Any, label: str, method: str, turn: int, what: str = "returned observations"
                    ) -> list[dict[str, str]]:
    """`value` as a list of chat messages {"role": str, "content": str}; an EnvError otherwise."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise EnvError(f"{_where(label, method, turn)} {what} that are {_kind(value)} "
                       f"({value!r:.60}); expected a list of chat messages {{'role': str, 'content': str}}")
    out = []
    for m in value:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or \
                not isinstance(m.get("content"), str):
            raise EnvError(f"{_where(label, method, turn)} {what} holding {m!r:.80}; expected "
                           "{'role': str, 'content': str}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def messages_ids(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids that follow an unfinished assistant turn when `messages` arrive, rendered once.

    One message is `jaxrl.envs.message_ids`; several (e.g. two tool results) are rendered the same way in one
    piece, so that no assistant header is put between them: the template is applied to [user "x", assistant
    SENTINEL, *messages] with the generation prompt, and the text after the sentinel is tokenized."""
    if len(messages) == 1:
        return message_ids(tokenizer, messages[0]["role"], messages[0]["content"])
    convo = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}, *messages]
    full = tokenizer.apply_chat_template(list(convo), tokenize=False, add_generation_prompt=True)
    _, found, tail = full.partition(_SENTINEL)
    if not found:
        raise ValueError("the chat template dropped the assistant content; cannot render a message delta")
    return encode_text(tokenizer, tail)


def chat(system: str | None, user: str) -> list[dict[str, str]]:
    """[system?, user] chat messages."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def stable_seed(record: Mapping[str, Any]) -> int:
    """A seed that is a function of the record alone (crc32 of its JSON), so the G episodes of a record start
    from the same state, as GRPO's group comparison assumes."""
    return zlib.crc32(json.dumps(dict(record), sort_keys=True, default=str).encode())


def string_tuple(values: Sequence[str], key: str) -> tuple[str, ...]:
    """`values` as a tuple of non-empty strings (a stop-strings param); ValueError otherwise."""
    if isinstance(values, str) or not all(isinstance(s, str) and s for s in values):
        raise ValueError(f"{key} must be a list of non-empty strings, got {values!r}")
    return tuple(values)
