"""Prompt sources as lists of records `{"prompt": str, "answer": str, **fields}`.

Built-in generators (`arithmetic`, `countdown`) are pure functions of a seed. `reasoning_gym:<task>` uses the
reasoning-gym package when installed; a `.jsonl` / `.json` / `.parquet` path is read with
`datasets.load_dataset`
and its `prompt_field` / `answer_field` columns are renamed to `prompt` / `answer` (other columns are kept as
reward fields).

A file is checked before it is loaded (`ConfigError`, one line, exit 2 in the CLI; the README's "Data" section
states the format): an empty file; for JSON, bytes that are not UTF-8 and lines that are not a JSON object
(each with its line number); and for every format a record without the prompt or answer field or with a null
one (`datasets` made it the literal text "None"), or with a prompt that is not text (a list of chat messages
would have become its Python repr).
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


def _json_rows(path: Path) -> list[tuple[int, Any]] | None:
    """(line number, value) of each record of a JSON-lines file or of a .json array (line 0: unknown);
    ConfigError naming the line of non-UTF-8 bytes or of a line that is not JSON. None for a .json file
    holding one multi-line object, which `datasets` reads as columns (checked after loading)."""
    where = f"data.source={str(path)!r}"
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a leading byte-order mark is allowed, as `datasets` allows it
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{where}: line {line} is not UTF-8 text (byte 0x{data[e.start]:02x}); save the "
                          "file as UTF-8") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: line {e.lineno} is not valid JSON ({e.msg})") from None
        return [(0, row) for row in value]
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            if path.suffix == ".json" and _is_json_object(text):
                return None
            raise ConfigError(f"{where}: line {n} is not valid JSON ({e.msg}); each line must hold one JSON "
                              "object") from None
    return rows


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _check_fields(path: Path, rows: list[tuple[int, Any]], prompt_field: str, answer_field: str) -> None:
    """ConfigError for the first record that is not an object or lacks (or nulls) the prompt or answer."""
    where = f"data.source={str(path)!r}"
    if not rows:
        raise ConfigError(f"{where}: the file holds no records")
    objects = [row for _, row in rows if isinstance(row, dict)]
    for key, field in (("data.prompt_field", prompt_field), ("data.answer_field", answer_field)):
        if objects and not any(field in row for row in objects):
            columns = sorted({k for row in objects for k in row})
            raise ConfigError(f"{key}={field!r}: not a column of {path} (columns: {', '.join(columns)})")
    for i, (line, row) in enumerate(rows):
        at = f"{where}: record {i}" + (f" (line {line})" if line else "")
        if not isinstance(row, dict):
            raise ConfigError(f"{at} is a JSON {type(row).__name__}, not an object "
                              f"{{\"{prompt_field}\": ..., \"{answer_field}\": ...}}")
        for key, field in (("data.prompt_field", prompt_field), ("data.answer_field", answer_field)):
            if row.get(field) is None:
                state = "is null" if field in row else "is missing"
                raise ConfigError(f"{at}: its {field!r} field ({key}) {state}; every record needs one")
        if isinstance(row[prompt_field], (list, dict)):
            raise ConfigError(f"{at}: its {prompt_field!r} field is a {type(row[prompt_field]).__name__}; "
                              "it must be the prompt text (jaxrl applies the chat template; "
                              "data.system_prompt sets the system message)")


def _load_file(path: Path, prompt_field: str, answer_field: str) -> list[dict[str, Any]]:
    import datasets

    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
    if kind is None:
        raise ConfigError(f"data.source={str(path)!r}: expected a .jsonl, .json or .parquet file")
    if not path.is_file():
        raise ConfigError(f"data.source={str(path)!r}: no such file")
    if path.stat().st_size == 0:
        raise ConfigError(f"data.source={str(path)!r}: the file is empty (no records)")
    rows = _json_rows(path) if kind == "json" else None  # with line numbers: `datasets` fails on these with
    if rows is not None:                                  # long tracebacks, or reads a null as "None"
        _check_fields(path, rows, prompt_field, answer_field)
    try:
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as e:  # noqa: BLE001 -- a file the user gave that `datasets` cannot read: one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ConfigError(f"data.source={str(path)!r}: cannot read it as {kind} ({type(e).__name__}: "
                          f"{first})") from None
    for key, field in (("data.prompt_field", prompt_field), ("data.answer_field", answer_field)):
        if field not in ds.column_names:
            raise ConfigError(
                f"{key}={field!r}: not a column of {path} (columns: {', '.join(ds.column_names)})"
            )
    if rows is None:  # parquet, or JSON columns: the loaded values, by record index
        _check_fields(path, [(0, {prompt_field: p, answer_field: a})
                             for p, a in zip(ds[prompt_field], ds[answer_field])], prompt_field, answer_field)
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
