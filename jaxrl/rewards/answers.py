"""Answer extraction and comparison for verifiable-answer rewards (exact answer and math answer).

`extract_answer` looks, in order, for the last `<answer>...</answer>`, the last `\\boxed{...}`, the text after
the last `####` (GSM8K style), and finally the last number in the text; with `tags_only=True` only the tagged
answer counts (a reward that demands the answer format). `math_equal` compares numerically when both sides
parse as numbers (integers, decimals, `a/b`, `\\frac{a}{b}`, thousands separators), accepts equal normalised
strings, and otherwise asks `math-verify` (a core dependency; `MathVerifyMissing` when it cannot be imported,
never a silent string-only comparison). math-verify guards parsing and verification with `signal.alarm`,
which only works on the main thread; on other threads it runs without its timeouts (shared ENV.md 3d).

Deviation from TRL/verl reward helpers: math-verify is tried only when the cheap numeric comparison cannot
decide, because it costs ~60 ms per pair on CPU and arithmetic answers never need it.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def _last_boxed(text: str) -> str | None:
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced braces: no answer rather than a guess


def extract_answer(text: str, *, tags_only: bool = False) -> str | None:
    """The final answer written in `text`, or None when there is none (see module docstring for the order)."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        inner = tags[-1].strip()
        boxed = _last_boxed(inner)
        return boxed.strip() if boxed is not None else inner
    if tags_only:
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(answer: str) -> str:
    """Canonical string form: no `$`, `\\text{}`, `\\left`/`\\right`, spacing, trailing period; lower case."""
    s = answer.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\\(left|right|!|,|;|quad)", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s).rstrip(".").lower()
    return s


def parse_number(answer: str) -> Fraction | None:
    """Exact value of a numeric answer (`-12`, `1,000`, `0.25`, `3/4`, `\\frac{3}{4}`, `50%`), else None."""
    s = normalize(answer)
    if s.endswith("%"):
        value = parse_number(s[:-1])
        return None if value is None else value / 100
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    m = _FRAC.match(s)
    if m:
        sign, num, den = m.groups()
        return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign else 1)
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return None if Fraction(den) == 0 else Fraction(num) / Fraction(den)
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


class MathVerifyMissing(ImportError):
    """math-verify (a core dependency of jaxrl) cannot be imported."""


def require_math_verify():
    """The `math_verify` module; MathVerifyMissing with the install command when it cannot be imported."""
    try:
        import math_verify
    except ImportError as e:
        raise MathVerifyMissing(
            f"math-verify cannot be imported ({e}); it is a core dependency of jaxrl: "
            "pip install 'math-verify[antlr4_13_2]==0.9.0'"
        ) from None
    return math_verify


class _NoTimeoutNotice(logging.Filter):
    """Drops math-verify's warning that its timeouts are off: jaxrl turns them off on purpose off the main
    thread (an asynchronous run scores in a background thread), where `signal.alarm` cannot work."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutNotice())


def _math_verify_equal(gold: str, pred: str) -> bool:
    """math-verify's verdict (False when it cannot parse either side); its signal-based timeouts are used only
    on the main thread."""
    math_verify = require_math_verify()
    main = threading.current_thread() is threading.main_thread()
    parse_kw = {} if main else {"parsing_timeout": None}
    verify_kw = {} if main else {"timeout_seconds": None}
    gold_parsed = math_verify.parse(gold if "$" in gold else f"${gold}$", **parse_kw)
    pred_parsed = math_verify.parse(pred if "$" in pred else f"${pred}$", **parse_kw)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(math_verify.verify(gold_parsed, pred_parsed, **verify_kw))


def math_equal(gold: str, pred: str, *, use_math_verify: bool = True) -> bool:
    """Whether answer `pred` equals reference `gold` mathematically (both already extracted).

    `use_math_verify=False` restricts the comparison to numbers and normalised strings (an explicit
    choice)."""
    a, b = parse_number(gold), parse_number(pred)
    if a is not None and b is not None:
        return a == b
    if normalize(gold) == normalize(pred):
        return True
    return use_math_verify and _math_verify_equal(gold, pred)


def gold_answer(reference: object) -> str:
    """The reference answer as a string; a GSM8K-style solution ('... #### 72') is reduced to its answer."""
    text = str(reference).strip()
    if parse_number(text) is None and ("####" in text or "\\boxed" in text or "<answer>" in text):
        return extract_answer(text) or text
    return text


def math_answer(
    prompts: list[str], completions: list[str], *, answer: list, use_math_verify: bool = True,
    tags_only: bool = False, literal: bool = True
) -> list[float]:
    """1.0 where the completion's final answer equals the `answer` field mathematically, else 0.0.

    `tags_only`: only an answer inside `<answer></answer>` counts (untagged text scores 0).
    `literal` (default): where the reference is a number, the answer must be a number too (`parse_number`: an
    integer, decimal, fraction or percentage); an expression equal in value scores 0. Without it math-verify
    evaluates the expression, and a policy can copy the question into the answer: SmolLM2-135M on
    reasoning-gym arithmetic learned "<answer>-4 + -4 * 4</answer>" for "Calculate -4 + -4 * 4." within 40
    GRPO steps (configs/smollm2_basic_arithmetic.yaml). References that are not numbers (expressions, sets,
    intervals) are compared by math-verify either way."""
    del prompts
    out = []
    for completion, ref in zip(completions, answer, strict=True):
        pred, gold = extract_answer(completion, tags_only=tags_only), gold_answer(ref)
        if pred is not None and literal and parse_number(gold) is not None and parse_number(pred) is None:
            out.append(0.0)
            continue
        out.append(float(pred is not None and math_equal(gold, pred, use_math_verify=use_math_verify)))
    return out


def exact_answer(prompts: list[str], completions: list[str], *, answer: list, tags_only: bool = False
                 ) -> list[float]:
    """1.0 where the extracted final answer equals the reference string after `normalize`, else 0.0
    (`tags_only` as in `math_answer`)."""
    del prompts
    out = []
    for completion, ref in zip(completions, answer, strict=True):
        pred = extract_answer(completion, tags_only=tags_only)
        out.append(float(pred is not None and normalize(pred) == normalize(gold_answer(ref))))
    return out
