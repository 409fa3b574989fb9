"""Tools: the calculator evaluates arithmetic by a whitelist walk (and refuses everything else); BM25 search
ranks the named entity's document first; tool calls are parsed from tags."""

import pytest

from jaxrl.data.entities import build_world
from jaxrl.envs import Calculator, Search, ToolError, calculate
from jaxrl.envs.tools import find_calls, format_results


@pytest.mark.parametrize("expr, value", [
    ("3*(4+5)", 27), ("2**10", 1024), ("7/2", 3.5), ("-3+1", -2), ("17//5", 3), ("17%5", 2),
    ("+4 - -2", 6), ("2**-2", 0.25), ("1.5*4", 6.0), (" (((1))) ", 1),
])
def test_calculator_values(expr, value):
    out = calculate(expr)
    assert out == value and type(out) is type(value)


@pytest.mark.parametrize("expr", [
    "__import__('os').system('echo hi')",  # call + name
    "(1).__class__",  # attribute access
    "().__class__.__bases__[0]",
    "2**100000",  # huge power: refused before computing
    "9**9**9",
    "10**30*10**30",  # result too large
    "'a'*3",  # strings
    "x+1",  # names
    "[1,2][0]",
    "1/0",
    "0**-1",
    "True+1",  # bools are not numbers here
    "lambda: 1",
    "1 if 2 else 3",
    "1e400",  # overflow to inf
    "1" + "+1" * 150,  # over 200 characters
    "(-8)**0.5",  # complex
])
def test_calculator_refuses(expr):
    with pytest.raises(ToolError):
        calculate(expr)


def test_calculator_deep_nesting_is_refused():
    with pytest.raises(ToolError, match="nested"):
        calculate("-" * 40 + "1")
    assert calculate("(" * 40 + "1" + ")" * 40) == 1  # parentheses add no ast depth
    assert Calculator()("2*3.5") == "7" and Calculator()("1/3") == "0.3333333333"


def test_search_ranks_the_named_document_first():
    world = build_world(3)
    search = Search(world.contents, top_k=2)
    for doc in world.docs[:20]:
        title = doc["contents"].split("\n")[0]
        assert search.index.search(title, 1) == [world.docs.index(doc)]
    out = search(world.docs[0]["contents"].split("\n")[0])
    first = world.docs[0]["contents"].split("\n")[0]
    assert out.startswith(f"Doc 1 (Title: {first})\n") and "\n\nDoc 2" in out
    assert search("zzqx qqqy") == "No results."
    with pytest.raises(ToolError):
        search("   ")


def test_format_and_find_calls():
    assert format_results(["A\nx y", "B\nz"]) == "Doc 1 (Title: A)\nx y\n\nDoc 2 (Title: B)\nz"
    text = "think <search> q1 </search> <calculator>1+1</calculator><search>open"
    assert find_calls(text, ["search", "calculator"]) == [("search", " q1 "), ("calculator", "1+1")]
    assert find_calls("<search>a</calculator>", ["search", "calculator"]) == []
