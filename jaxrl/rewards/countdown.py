"""Countdown reward: the answer is an arithmetic expression that uses exactly the given numbers and hits the
target.

The expression is parsed with `ast` and evaluated by walking the tree with exact `Fraction` arithmetic; only
integer literals, `+ - * /` and parentheses are accepted (no names, calls, powers, unary operators or floats),
so
nothing a model writes is ever executed. This follows the TinyZero / reasoning-gym countdown rules: every
given
number used exactly once (as a multiset), no other numbers.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from jaxrl.rewards.answers import _ANSWER_TAG

MAX_EXPRESSION_CHARS = 200
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_ALLOWED_CHARS = re.compile(r"^[\d\s+\-*/()]+$")


class InvalidExpression(ValueError):
    """The text is not an expression made of integers, + - * / and parentheses."""


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, used), _walk(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise InvalidExpression("division by zero")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise InvalidExpression(f"{type(node).__name__} is not allowed")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of `expression` and the integer literals it uses; raises InvalidExpression."""
    text = expression.strip()
    if len(text) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.match(text):
        raise InvalidExpression("only integers, + - * / and parentheses are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise InvalidExpression(f"syntax error: {e.msg}") from None
    used: list[int] = []
    return _walk(tree.body, used), used


def extract_expression(completion: str) -> str | None:
    """The expression in the last `<answer>` tag, else the last line; a trailing `= target` is dropped."""
    tags = _ANSWER_TAG.findall(completion)
    text = tags[-1] if tags else (completion.strip().splitlines() or [""])[-1]
    text = text.split("=")[0].strip()
    return text or None


def countdown_correct(completion: str, numbers: list[int], target: int) -> bool:
    """Whether the completion's expression uses exactly `numbers` (as a multiset) and equals `target`."""
    expression = extract_expression(completion)
    if expression is None:
        return False
    try:
        value, used = evaluate(expression)
    except InvalidExpression:
        return False
    return Counter(used) == Counter(int(n) for n in numbers) and value == target


def countdown(
    prompts: list[str],
    completions: list[str],
    *,
    numbers: list,
    target: list,
    format_score: float = 0.0,
) -> list[float]:
    """1.0 for a correct countdown expression, `format_score` for a parsable but wrong one, else 0.0."""
    del prompts
    out = []
    for completion, nums, tgt in zip(completions, numbers, target, strict=True):
        if countdown_correct(completion, list(nums), int(tgt)):
            out.append(1.0)
            continue
        expression = extract_expression(completion)
        try:
            parsable = expression is not None and evaluate(expression) is not None
        except InvalidExpression:
            parsable = False
        out.append(format_score if parsable else 0.0)
    return out
