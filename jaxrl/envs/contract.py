"""The `Env` contract, checked on every call (`checked_reset`, `checked_step`, `checked_demonstration`).

A violation is one `EnvError` line naming the class, the method, the record (and turn) and what was expected:

    reset(record)        -> a non-empty list of token ids in [0, vocab)
    step(action)         -> StepResult: observation ids in [0, vocab) (non-empty unless done), a finite
                            reward, a bool done, a mapping info; a step that raises or runs past
                            `step_timeout_s` fails too
    demonstration(record) -> a list of action texts (a string is refused: it would be played one character
                            per turn)

What happens at a failed step is the caller's choice (`EpisodeBudget.on_error`): "raise" stops the run (exit 2),
"end_episode" ends that episode with return 0 and counts it (`env/errors`). A reset that fails always raises:
there is no prompt to train on. `dry_run` plays reset + one step on one record before the first update, so a
broken environment stops the run before anything trains on it.

Timeouts: with `step_timeout_s` each step runs in a daemon worker thread and the caller waits at most that
long; a step still running then is abandoned (Python cannot kill a thread; the episode never touches its env
again) and fails. So a hung tool cannot keep the train loop from reaching its preemption check (SIGTERM still
saves and exits 75). Without it (None, the default) steps run on the calling thread, as before: an env whose
state is bound to its thread (an sqlite connection) keeps working.
"""

from __future__ import annotations

import math
import numbers
import threading
import traceback
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl.envs.base import Action, StepResult, encode_text
from jaxrl.errors import EnvError

ON_ERROR = ("raise", "end_episode")


def _kind(x: Any) -> str:
    return "None" if x is None else f"a {type(x).__name__}"


def _where(env, method: str, record: int, turn: int | None) -> str:
    at = f"record {record}" if turn is None else f"record {record}, turn {turn}"
    return f"{type(env).__name__}.{method} ({at})"


def _raised(where: str, e: BaseException) -> EnvError:
    frames = traceback.extract_tb(e.__traceback__)
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    text = str(e).strip().splitlines()
    return EnvError(f"{where} raised {type(e).__name__}{': ' + text[0] if text else ''}{at}")


def _user_call(where: str, fn, *args):
    """`fn(*args)`: a user method; anything it raises but an EnvError becomes one EnvError line naming it."""
    try:
        return fn(*args)
    except EnvError:
        raise
    except Exception as e:  # noqa: BLE001 -- user code: one line naming it
        raise _raised(where, e) from None


def check_ids(ids: Any, vocab: int, where: str, what: str) -> list[int]:
    """`ids` as a list of ints, or EnvError unless it is a 1-D sequence of integer ids in [0, vocab)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise EnvError(f"{where}: {what} is an array of shape {ids.shape} and dtype {ids.dtype}; "
                           "expected a 1-D list of integer token ids")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise EnvError(f"{where}: {what} is {_kind(ids)}; expected a list of integer token ids (encode text "
                       "with jaxrl.envs.encode_text)")
    out = []
    for x in ids:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise EnvError(f"{where}: {what} holds {_kind(x)} ({x!r}); expected integer token ids")
        if not 0 <= int(x) < vocab:
            raise EnvError(f"{where}: {what} holds id {int(x)}, outside the vocabulary [0, {vocab})")
        out.append(int(x))
    return out


def checked_reset(env, record: Mapping[str, Any], index: int, vocab: int) -> list[int]:
    """The prompt ids of `env.reset(record)`; EnvError for an exception, a wrong type, empty or bad ids."""
    where = _where(env, "reset", index, None)
    ids = _user_call(where, env.reset, record)
    ids = check_ids(ids, vocab, where, "the prompt")
    if not ids:
        raise EnvError(f"{where}: returned an empty prompt; expected the prompt's token ids (with the "
                       "generation prompt)")
    return ids


def _call(fn, timeout_s: float | None):
    """fn() on this thread (timeout None) or on a daemon worker waited for at most `timeout_s` seconds;
    TimeoutError when it is still running then."""
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
            box["error"] = e

    worker = threading.Thread(target=work, name="jaxrl-env-step", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box["value"]


def checked_step(env, action: Action, index: int, turn: int, vocab: int,
                 timeout_s: float | None = None) -> tuple[list[int], float, bool, dict[str, Any]]:
    """(observation ids, reward, done, info) of `env.step(action)`, checked; EnvError otherwise (module doc).

    Args:
      env: the episode's environment; action: the model's turn.
      index: the record's index in the batch and `turn` the model turn (1-based), for the message.
      vocab: token ids must be in [0, vocab) (the tokenizer's size).
      timeout_s: wait at most this long for the step (None: call it on this thread, no limit).
    """
    where = _where(env, "step", index, turn)
    try:
        res = _call(lambda: env.step(action), timeout_s)
    except TimeoutError:
        raise EnvError(f"{where} did not return within env.step_timeout_s={timeout_s:g} s") from None
    except EnvError:
        raise
    except Exception as e:  # noqa: BLE001 -- user code: one line naming it
        raise _raised(where, e) from None
    if not isinstance(res, StepResult):
        raise EnvError(f"{where}: returned {_kind(res)}; expected jaxrl.envs.StepResult(observation, reward, "
                       "done, info)")
    reward = res.reward
    if isinstance(reward, (str, bytes)) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise EnvError(f"{where}: reward {reward!r} is not a finite number")
    if not isinstance(res.done, (bool, np.bool_)):
        raise EnvError(f"{where}: done is {_kind(res.done)}; expected a bool")
    if not isinstance(res.info, Mapping):
        raise EnvError(f"{where}: info is {_kind(res.info)}; expected a mapping (dict)")
    obs = check_ids(res.observation, vocab, where, "the observation")
    if not obs and not res.done:
        raise EnvError(f"{where}: returned an empty observation with done=False; expected the observation's "
                       "token ids, or done=True")
    return obs, float(reward), bool(res.done), dict(res.info)


def checked_demonstration(env, record: Mapping[str, Any], index: int) -> list[str]:
    """`env.demonstration(record)` as a list of action texts; EnvError for anything else (a string would be
    imitated one character per turn)."""
    where = _where(env, "demonstration", index, None)
    actions = _user_call(where, env.demonstration, record)
    if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence):
        raise EnvError(f"{where}: returned {_kind(actions)}; expected a list of action texts (list[str]), "
                       "e.g. ['<search>x</search>', '<answer>y</answer>']")
    bad = next((a for a in actions if not isinstance(a, str)), None)
    if bad is not None:
        raise EnvError(f"{where}: an action is {_kind(bad)} ({bad!r}); expected action texts (str)")
    return list(actions)


def dry_run(env_factory, record: Mapping[str, Any], tokenizer, *, timeout_s: float | None = None) -> None:
    """Setup check: a fresh env plays reset + one step on `record` (its demonstration's first action when it
    has one, else the text "ok"); any violation raises EnvError whatever `on_error` says."""
    vocab = len(tokenizer)
    env = env_factory(tokenizer)
    checked_reset(env, record, 0, vocab)
    text = "ok"
    if callable(getattr(env, "demonstration", None)):
        text = (checked_demonstration(env, record, 0) or [text])[0]
    ids = tuple(encode_text(tokenizer, text)) or (int(tokenizer.eos_token_id),)
    checked_step(env, Action(ids, text, False), 0, 1, vocab, timeout_s)
