"""Prompt sources as lists of records `{"prompt": str, "answer": str, **fields}`.

Built-in generators (`arithmetic`, `countdown`) are pure functions of a seed. `reasoning_gym:<task>` uses the
reasoning-gym package when installed; a `.jsonl` / `.json` / `.parquet` path is read with
`datasets.load_dataset`
and its `prompt_field` / `answer_field` columns are renamed to `prompt` / `answer` (other columns are kept as
reward fields).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl.errors import ConfigError

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic(n: int, seed: int, *, max_operand: int = 50, ops: str = "+-",
               max_second: int | None = None, second_step: int = 1) -> list[dict[str, Any]]:
    """`n` problems "What is a + b?" with 0 <= a <= max_operand and b a multiple of `second_step` in
    [0, max_second] (default max_operand); for "-" the larger operand comes first so answers are >= 0."""
    bad = set(ops) - set(_OPS)
    if not ops or bad:
        raise ConfigError(f"data.params.ops={ops!r}: use a non-empty string of the operators '+', '-', '*'")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = int(rng.integers(0, max_operand + 1))
        top = max_operand if max_second is None else max_second
        b = second_step * int(rng.integers(0, top // second_step + 1))
        op = ops[int(rng.integers(len(ops)))]
        if op == "-" and a < b:
            a, b = b, a
        out.append({"prompt": f"What is {a} {op} {b}?", "answer": str(_OPS[op](a, b))})
    return out


def _random_expression(rng: np.random.Generator, numbers: list[int]) -> tuple[str, int]:
    """A random integer-valued expression using every number once (division only when exact)."""
    items = [(str(x), x) for x in numbers]
    while len(items) > 1:
        i, j = rng.choice(len(items), size=2, replace=False)
        (ea, a), (eb, b) = items[i], items[j]
        choices = ["+", "*"] + (["-"] if a >= b else []) + (["/"] if b and a % b == 0 else [])
        op = choices[int(rng.integers(len(choices)))]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        items = [x for k, x in enumerate(items) if k not in (i, j)] + [(f"({ea} {op} {eb})", value)]
    expr, value = items[0]
    return (expr[1:-1] if expr.startswith("(") else expr), value


def countdown(n: int, seed: int, *, num_numbers: int = 3, max_number: int = 10) -> list[dict[str, Any]]:
    """`n` solvable countdown problems: reach `target` with `numbers` (each once) and + - * /."""
    if num_numbers < 2 or max_number < 1:
        raise ConfigError(
            f"countdown: need data.params.num_numbers >= 2 and max_number >= 1, got "
            f"{num_numbers}, {max_number}"
        )
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        numbers = [int(x) for x in rng.integers(1, max_number + 1, size=num_numbers)]
        expr, target = _random_expression(rng, numbers)
        listed = ", ".join(map(str, numbers))
        out.append(
            {
                "prompt": f"Use {listed} once each with + - * / to make {target}.",
                "answer": expr,
                "numbers": numbers,
                "target": target,
            }
        )
    return out


def entities(n: int, seed: int, *, corpus_seed: int = 0, corpus_size: str = "tiny", max_hops: int = 3
             ) -> list[dict[str, Any]]:
    """Questions about the fictional world `jaxrl.data.entities.build_world(corpus_seed, corpus_size)` (the
    world the `search` environment searches), at most `n`, shuffled by `seed`; `max_hops` caps the number of
    documents a question needs. Fields: prompt (the question), answer, answers, chain, hops."""
    from jaxrl.data.entities import SIZES, build_world

    if corpus_size not in SIZES:
        raise ConfigError(f"data.params.corpus_size={corpus_size!r}: allowed values are "
                          f"{', '.join(map(repr, SIZES))}")
    qs = [q for q in build_world(int(corpus_seed), corpus_size).questions if q["hops"] <= max_hops]
    order = np.random.default_rng(seed).permutation(len(qs))[:n]
    return [{"prompt": qs[i]["question"], "question": qs[i]["question"], "answer": qs[i]["answers"][0],
             "answers": list(qs[i]["answers"]), "chain": list(qs[i]["chain"]), "hops": qs[i]["hops"]}
            for i in order]


GENERATORS = {"arithmetic": arithmetic, "countdown": countdown, "entities": entities}


def _reasoning_gym(task: str, n: int, seed: int, params: dict[str, Any]) -> list[dict[str, Any]]:
    """reasoning-gym records; `task` and the JSON `metadata` are kept for the `reasoning_gym` reward, and
    countdown's `numbers` / `target` are lifted to fields for the built-in `countdown` reward."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ConfigError(
            f"data.source='reasoning_gym:{task}' needs the reasoning-gym package (pip install "
            "reasoning-gym==0.1.25)"
        )
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(task, size=n, seed=seed, **params)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"data.source='reasoning_gym:{task}': {e}") from None
    out = []
    for x in ds:
        meta = x.get("metadata", {})
        rec = {
            "prompt": x["question"],
            "answer": str(x["answer"]),
            "task": task,
            "metadata": json.dumps(meta, default=str),
        }
        rec.update({k: meta[k] for k in ("numbers", "target") if k in meta})
        out.append(rec)
    return out


def _load_file(path: Path, prompt_field: str, answer_field: str) -> list[dict[str, Any]]:
    import datasets

    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
    if kind is None:
        raise ConfigError(f"data.source={str(path)!r}: expected a .jsonl, .json or .parquet file")
    if not path.is_file():
        raise ConfigError(f"data.source={str(path)!r}: no such file")
    ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    for key, field in (("data.prompt_field", prompt_field), ("data.answer_field", answer_field)):
        if field not in ds.column_names:
            raise ConfigError(
                f"{key}={field!r}: not a column of {path} (columns: {', '.join(ds.column_names)})"
            )
    out = []
    for row in ds:
        rec = {k: v for k, v in row.items() if k not in (prompt_field, answer_field)}
        rec["prompt"], rec["answer"] = str(row[prompt_field]), str(row[answer_field])
        out.append(rec)
    return out


def load_records(
    source: str,
    n: int,
    seed: int,
    *,
    params: dict[str, Any] | None = None,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
) -> list[dict[str, Any]]:
    """Records of a source: built-in generator name, `reasoning_gym:<task>`, or a local file (all rows)."""
    params = dict(params or {})
    if source in GENERATORS:
        try:
            return GENERATORS[source](n, seed, **params)
        except TypeError as e:
            raise ConfigError(f"data.params for source {source!r}: {e}") from None
    if source.startswith("reasoning_gym:"):
        return _reasoning_gym(source.split(":", 1)[1], n, seed, params)
    if Path(source).suffix:
        return _load_file(Path(source), prompt_field, answer_field)
    raise ConfigError(
        f"data.source={source!r}: use one of {', '.join(map(repr, GENERATORS))}, "
        "'reasoning_gym:<task>', or a .jsonl/.parquet path"
    )
