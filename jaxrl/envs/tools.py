"""Tools an environment can offer the model: a safe calculator and offline BM25 search over a local corpus.

A tool is a callable `tool(argument: str) -> str`; it raises `ToolError` for a bad call, which the
environment turns into an observation (counted in `tool_errors`), never into a crash. `TOOLS` maps a tool
name to its factory; `find_calls` extracts `<name>argument</name>` calls from an action's text.
"""

from __future__ import annotations

import ast
import functools
import logging
import math
import operator
import re
from typing import Callable, Sequence

import numpy as np


class ToolError(Exception):
    """A tool call that cannot be served (bad syntax, refused operation, empty query); the message is shown
    to the model."""


# --- calculator ---------------------------------------------------------------------------------------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_CHARS, _MAX_DEPTH, _MAX_EXPONENT, _MAX_ABS = 200, 32, 64, 1e30


def calculate(expression: str) -> int | float:
    """Evaluates an arithmetic expression by walking its `ast` with a whitelist (never `eval`).

    Allowed: int/float literals, + - * / // % **, unary + -, parentheses. Refused (ToolError): names,
    calls, attributes, subscripts, strings, exponents above 64 in magnitude, results above 1e30 in
    magnitude, division by zero, more than 200 characters or nesting deeper than 32.
    """
    text = str(expression).strip()
    if not text or len(text) > _MAX_CHARS:
        raise ToolError(f"expression must have 1 to {_MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {text!r}") from None
    return _eval(tree.body, 0)


def _eval(node: ast.AST, depth: int) -> int | float:
    if depth > _MAX_DEPTH:
        raise ToolError("expression is nested too deeply")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ToolError(f"exponent {right} is larger than {_MAX_EXPONENT} in magnitude")
        if isinstance(node.op, ast.Pow) and left == 0 and right < 0:
            raise ToolError("zero to a negative power")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError) as e:
            raise ToolError(str(e)) from None
        if isinstance(value, complex):
            raise ToolError("complex result")
        return _checked(value)
    raise ToolError(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")


def _checked(value: int | float) -> int | float:
    if not math.isfinite(value) or abs(value) > _MAX_ABS:
        raise ToolError(f"result is not finite or exceeds {_MAX_ABS:g} in magnitude")
    return value


def format_number(value: int | float) -> str:
    """Integers as digits; floats with up to 10 significant digits, trailing zeros dropped."""
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


class Calculator:
    """The calculator tool: `calculator("3*(4+5)") -> "27"`."""

    name = "calculator"

    def __call__(self, argument: str) -> str:
        return format_number(calculate(argument))


# --- search ------------------------------------------------------------------------------------------------


class SearchIndex:
    """BM25 (k1 = 1.2, b = 0.75, Lucene IDF) over `contents` strings ("Title\\ntext"), via `bm25s`.

    Deterministic: scores are computed for every document and ties are broken by document order.
    """

    def __init__(self, contents: Sequence[str], *, k1: float = 1.2, b: float = 0.75):
        import bm25s  # core dependency; imported here so `jaxrl.envs` loads without building anything

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on import
        self.contents = list(contents)
        self._bm25s = bm25s
        self._index = bm25s.BM25(k1=k1, b=b)
        self._index.index(bm25s.tokenize(self.contents, stopwords="en", show_progress=False),
                          show_progress=False)

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the top-k documents for `query` (only documents with a positive score)."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not tokens or not tokens[0]:
            return []
        scores = np.asarray(self._index.get_scores(tokens[0]), np.float64)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [int(i) for i in order if scores[i] > 0]


def format_results(contents: Sequence[str]) -> str:
    """Search-R1 style: `Doc i (Title: <first line>)\\n<rest>` blocks separated by blank lines."""
    blocks = []
    for i, doc in enumerate(contents, 1):
        title, _, text = doc.partition("\n")
        blocks.append(f"Doc {i} (Title: {title})\n{text}")
    return "\n\n".join(blocks)


class Search:
    """The search tool over a fixed corpus: `search("Quenby") -> formatted top-k documents`."""

    name = "search"

    def __init__(self, contents: Sequence[str], top_k: int = 2):
        if int(top_k) < 1:
            raise ToolError(f"top_k must be >= 1, got {top_k}")
        self.index, self.top_k = _cached_index(tuple(contents)), int(top_k)

    def __call__(self, argument: str) -> str:
        query = str(argument).strip()
        if not query:
            raise ToolError("empty search query")
        hits = self.index.search(query, self.top_k)
        if not hits:
            return "No results."
        return format_results([self.index.contents[i] for i in hits])


@functools.lru_cache(maxsize=8)
def _cached_index(contents: tuple[str, ...]) -> SearchIndex:
    return SearchIndex(contents)


TOOLS: dict[str, Callable[..., Callable[[str], str]]] = {"calculator": Calculator, "search": Search}


def find_calls(text: str, names: Sequence[str]) -> list[tuple[str, str]]:
    """(name, argument) of every complete `<name>argument</name>` in `text`, in order of appearance."""
    if not names:
        return []
    alt = "|".join(re.escape(n) for n in names)
    return [(m.group(1), m.group(2)) for m in re.finditer(rf"<({alt})>(.*?)</\1>", text, flags=re.DOTALL)]
