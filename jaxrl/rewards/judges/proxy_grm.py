"""The `proxy_grm` reward type: Proxy-GRM's reward for a generative reward model (GRM) policy.

Proxy-GRM (arXiv:2603.16600; reference Qwen-Applications/Proxy-GRM,
`verl/verl/utils/reward_score/grm_reward_with_instruct.py::compute_score`, `proxy/proxy.py`). The policy reads
a question and two responses and writes `<rubric>…</rubric><eval>…</eval><answer>1|2</answer>` (or
`<think>…</think><summary>…</summary><answer>…</answer>`). Per completion::

    r_acc   = +1 if the completion's <answer> names the preferred response `answer` (a field: "1" or "2"),
              −1 otherwise (naming both → −1)                                       (`verify_math`)
    r_proxy = +1 if the proxy judge, shown only the question, both responses and the completion's rubric
              (text up to </rubric>, cut at <justify>), picks `answer`; −1 if it picks the other or nothing;
              0 if the judge gave no reply                                         (`instruct_verify`)
    r_fmt   = 1 if one of the two layouts matches exactly (newlines removed, one of each tag), else 0
              (`verify_format`); or re.fullmatch(format_pattern, completion) when format_pattern is given
    R       = jaxrl.losses.research.proxy_grm.proxy_grm_reward(r_acc, r_proxy, r_fmt, use_fb, use_proxy,
                                                               format_weight)

The proxy is a judge spec (`jaxrl.rewards.judges.local_judge`: `{model: PATH, ...}` or `{generate: "module:f"}`),
sent `PROXY_REQUEST` filled with the sample's fields `question`, `response_1`, `response_2` and the rubric,
all requests of a step in one call; its pick is the reply's <answer> content, else its last "1"/"2" (as
`proxy/proxy.py`). Or a function `proxy(question, response_1, response_2, rubric) -> reply text`, called per
sample; one that raises scores r_proxy = 0 (the reference's failed HTTP call). A proxy that gives no reply for
any sample of a call (it raised every time, or no request fit its context) is not a judge: the call raises, so
the samples fail (the reward's `on_error`) and a judge that stays down trips the run's reward-failure guard.

Deviations from the reference: `PROXY_REQUEST` is this module's wording of the reference proxy prompt, with no
image (jaxrl models are text-only); `use_fb`, `use_proxy` and the format weight are params, not environment
variables (`use_format=0` is `format_weight: 0`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxrl.rewards.imports import import_function
from jaxrl.rewards.judges.local_judge import text_generator
from jaxrl.rewards.judges.openrs_judge import fill

PROXY_REQUEST = (
    "You are a precise evaluation assistant. Read the question and the two responses, evaluate both strictly "
    "by the evaluation rubric, and compare their strengths and weaknesses inside <think></think>. Then "
    "answer inside <answer></answer> with 1 if Response 1 is better or 2 if Response 2 is better.\n\n"
    "Question: {question}\nResponse 1: {response_1}\nResponse 2: {response_2}\n"
    "Evaluation rubric: {rubric}\nFormat: <think>your reasons</think><answer>1 or 2</answer>\n"
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LAYOUTS = ((re.compile(r"^<think>.*?</think><summary>.*?</summary><answer>.*?</answer>$", re.DOTALL),
             ("<think>", "<answer>", "<summary>")),
            (re.compile(r"^<rubric>.*?</rubric><eval>.*?</eval><answer>.*?</answer>$", re.DOTALL),
             ("<rubric", "<eval>", "<answer>")))


def names_preferred(pick: str | None, answer: str) -> float:
    """+1 if `pick` names the response `answer` names ("1" / "2") and not the other one, else −1."""
    if not pick:
        return -1.0
    for mine, other in (("1", "2"), ("2", "1")):
        if mine in pick and mine in answer:
            return -1.0 if other in pick else 1.0
    return -1.0


def _tagged(text: str) -> str:
    match = _ANSWER.search(text)
    return match.group(1).strip() if match else text.strip()


def accuracy_reward(completion: str, answer: str) -> float:
    """r_acc: the completion's <answer> content (or all of it), letters and digits only, vs `answer`."""
    def clean(s: str) -> str:
        return re.sub(r"[^a-zA-Z0-9]", "", s)
    return names_preferred(clean(_tagged(completion)), clean(_tagged(str(answer))))


def format_ok(completion: str, pattern: str | None = None) -> bool:
    """r_fmt: one of the two reference layouts (newlines removed, one of each tag), or `pattern`."""
    if pattern is not None:
        return re.fullmatch(pattern, completion, re.DOTALL) is not None
    text = completion.replace("\n", "")
    return any(regex.match(text) is not None and all(text.count(tag) == 1 for tag in tags)
               for regex, tags in _LAYOUTS)


def extract_rubric(completion: str) -> str:
    """The rubric the proxy sees: the completion up to </rubric> (cut at <justify>), closed with </rubric>."""
    rubric = completion.split("</rubric>")[0]
    return rubric.split("<justify>")[0] + "</rubric>"


def proxy_pick(reply: str) -> str | None:
    """The proxy's pick: its <answer> content, else the last "1" or "2" in the reply, else None."""
    match = _ANSWER.search(reply)
    if match:
        return match.group(1).strip()
    digits = re.findall(r"[12]", reply)
    return digits[-1] if digits else None


def _proxy_replies(proxy: str | Callable[..., str] | Mapping[str, Any], questions: Sequence[str],
                   first: Sequence[str], second: Sequence[str], rubrics: Sequence[str]) -> list[str | None]:
    if isinstance(proxy, Mapping):
        requests = [fill(PROXY_REQUEST, question=q, response_1=a, response_2=b, rubric=r)
                    for q, a, b, r in zip(questions, first, second, rubrics, strict=True)]
        replies = list(text_generator(proxy)(requests))
        if len(replies) != len(requests):
            raise ValueError(f"proxy judge: {len(replies)} replies for {len(requests)} requests")
        if replies and all(r is None for r in replies):
            raise RuntimeError(f"proxy judge gave no reply to any of the {len(replies)} requests (none fit "
                               "its context, or its generate function returned None)")
        return replies
    fn = import_function(proxy, "rewards.params.proxy") if isinstance(proxy, str) else proxy
    replies: list[str | None] = []
    error = None
    for args in zip(questions, first, second, rubrics, strict=True):
        try:
            replies.append(str(fn(*args)))
        except Exception as e:  # noqa: BLE001 -- the reference's failed proxy call: r_proxy = 0
            error = error or f"{type(e).__name__}: {e}"
            replies.append(None)
    if replies and error is not None and all(r is None for r in replies):
        raise RuntimeError(f"proxy judge failed on all {len(replies)} samples; first error: {error}")
    return replies


def proxy_grm_score(prompts: list[str], completions: list[str], answer: Sequence[str],
                    question: Sequence[str] | None = None, response_1: Sequence[str] | None = None,
                    response_2: Sequence[str] | None = None, *,
                    proxy: str | Callable[..., str] | Mapping[str, Any] | None = None, use_fb: int = 0,
                    use_proxy: bool = True, format_weight: float = 0.5,
                    format_pattern: str | None = None) -> list[float]:
    """Per-sample Proxy-GRM rewards R (see the module docstring)."""
    import jax.numpy as jnp

    from jaxrl.losses.research.proxy_grm import proxy_grm_reward

    del prompts
    acc = [accuracy_reward(c, a) for c, a in zip(completions, answer, strict=True)]
    fmt = [float(format_ok(c, format_pattern)) for c in completions]
    proxy_r = [0.0] * len(completions)
    if use_proxy:
        if proxy is None or question is None or response_1 is None or response_2 is None:
            raise ValueError("proxy_grm with use_proxy needs params.proxy and the per-sample fields "
                             "question, response_1, response_2")
        replies = _proxy_replies(proxy, question, response_1, response_2,
                                 [extract_rubric(c) for c in completions])
        proxy_r = [0.0 if r is None else names_preferred(proxy_pick(r), str(a))
                   for r, a in zip(replies, answer)]
    total = proxy_grm_reward(jnp.asarray(acc, jnp.float32), jnp.asarray(proxy_r, jnp.float32),
                             jnp.asarray(fmt, jnp.float32), use_fb=use_fb, use_proxy=use_proxy,
                             format_weight=format_weight)
    return [float(x) for x in np.asarray(total).reshape(-1)]
