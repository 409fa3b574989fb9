"""The environment API for multi-turn, tool-using episodes: observations and actions are token ids.

An episode alternates model actions and environment observations inside one growing token sequence:

    context = reset(record) | a_1 | o_1 | a_2 | o_2 | … | a_m        (o_m, given with done, is never fed)

Actions are exactly the sampled token ids (plus their decoded text for parsing); observations are token ids
that the environment renders once, when they are appended (`message_ids` for a chat message, `text_ids` for
text inlined into the assistant turn, as Search-R1 does). The training row is that concatenation, never a
re-rendering of the finished conversation, which keeps old log-probs and masks exact (verl's agent-loop
lesson; arXiv:2503.09516 for the inline search format).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

_SENTINEL = "\u2063JAXRL_SPLIT\u2063"


@dataclasses.dataclass(frozen=True)
class Action:
    """One model turn: the sampled token ids, their decoded text and whether it ended with EOS."""

    ids: tuple[int, ...]
    text: str
    eos: bool = False


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What `Env.step` returns: the observation to append (token ids), the turn's reward, done, info.

    info keys counted by the rollout: "tool_calls" (int), "tool_errors" (int); other keys are kept per turn.
    """

    observation: list[int]
    reward: float
    done: bool
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """One episode at a time; `collect_episodes` makes one instance per episode (its state is private).

    Attributes:
      stop_strings: strings that end a model turn (e.g. "</search>"); EOS always ends one.
    """

    stop_strings: tuple[str, ...]

    def reset(self, record: Mapping[str, Any]) -> list[int]:
        """Starts an episode for a dataset record; returns the prompt token ids (with generation prompt)."""

    def step(self, action: Action) -> StepResult:
        """Consumes one model turn; returns the observation ids to append, the reward and done."""


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of `text` alone, without BOS/EOS (special-token strings in it map to their ids)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The chat template applied to `messages` with the generation prompt, as token ids."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return encode_text(tokenizer, text)


def message_ids(tokenizer, role: str, content: str) -> list[int]:
    """Token ids that follow an unfinished assistant turn when a `role` message arrives, rendered once.

    The template is applied to [user "x", assistant SENTINEL, role content] with the generation prompt, and
    the text after the sentinel is tokenized: the assistant's end-of-turn marker (the model stopped at a stop
    string, so it never sampled one), the new message and the next assistant header.

    Args:
      tokenizer: an HF tokenizer with a chat template (the built-in character tokenizer has one).
      role: "user", "tool", … (the template must know it; the built-in template treats unknown roles as
        assistant messages, so use "user" with it).
      content: the message text.

    Returns:
      list of token ids to append to the context.
    """
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL},
                {"role": role, "content": content}]
    full = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    _, found, tail = full.partition(_SENTINEL)
    if not found:
        raise ValueError("the chat template dropped the assistant content; cannot render a message delta")
    return encode_text(tokenizer, tail)
