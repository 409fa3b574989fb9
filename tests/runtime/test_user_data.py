"""A user's data file (issue 30, item 6): every way a JSONL / JSON / parquet file can be unusable is one line
naming the file and the line or record (ConfigError, exit 2 in the CLI) before anything compiles: an empty
file, a line that is not JSON or not UTF-8, a record without (or with a null) prompt or answer, a prompt that
is a list of chat messages, and a prompt longer than the rollout can take (`data.on_long_prompt: error |
drop`). The README's "Data" section states the format."""

import json
import logging

import pytest

from jaxrl.cli import main
from jaxrl.data import Encoder, PromptLimit, check_prompt_lengths, load_records, make_splits
from jaxrl.errors import ConfigError
from jaxrl.io.tokenizer import builtin_tokenizer
from tests.runtime import _trainer as T

GOOD = {"prompt": "What is 1 + 1?", "answer": "2"}


def _jsonl(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _load(path, **kw):
    return load_records(str(path), 0, 0, **kw)


@pytest.mark.parametrize("lines,message", [
    ([json.dumps(GOOD), json.dumps({"prompt": "x"})],
     "record 1 (line 2): its 'answer' field (data.answer_field) is missing; every record needs one"),
    ([json.dumps(GOOD), "", json.dumps({"prompt": "x", "answer": None})],
     "record 1 (line 3): its 'answer' field (data.answer_field) is null"),
    ([json.dumps({"answer": "1", "prompt": None}), json.dumps(GOOD)],
     "record 0 (line 1): its 'prompt' field (data.prompt_field) is null"),
    ([json.dumps(GOOD), json.dumps(GOOD), '{"prompt": "x", "answer": 3'],
     "line 3 is not valid JSON (Expecting ',' delimiter); each line must hold one JSON object"),
    (["[1, 2]"], "record 0 (line 1) is a JSON list, not an object"),
    ([json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": "1"})],
     "record 0 (line 1): its 'prompt' field is a list; it must be the prompt text (jaxrl applies the chat "
     "template"),
    (["", "  "], "the file holds no records"),
])
def test_bad_jsonl_is_one_line_naming_the_record(tmp_path, lines, message):
    path = _jsonl(tmp_path / "d.jsonl", *lines)
    with pytest.raises(ConfigError) as e:
        _load(path)
    assert str(e.value) == f"data.source={str(path)!r}: {message}" or \
        str(e.value).startswith(f"data.source={str(path)!r}: {message}")
    assert "\n" not in str(e.value)


def test_empty_and_non_utf8_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"empty\.jsonl': the file is empty \(no records\)$"):
        _load(empty)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(GOOD).encode() + b'\n{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ConfigError, match=r"latin\.jsonl': line 2 is not UTF-8 text \(byte 0xe9\); save the "
                                          r"file as UTF-8$"):
        _load(latin)


def test_json_and_parquet_records_are_checked_too(tmp_path):
    array = tmp_path / "a.json"
    array.write_text(json.dumps([GOOD, {"prompt": "x", "answer": None}]))
    with pytest.raises(ConfigError, match=r"a\.json': record 1: its 'answer' field \(data\.answer_field\) is "
                                          r"null"):
        _load(array)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"q": ["a", "b", "c"], "a": ["1", None, "3"]}), table)
    with pytest.raises(ConfigError, match=r"t\.parquet': record 1: its 'a' field \(data\.answer_field\) is "
                                          r"null"):
        _load(table, prompt_field="q", answer_field="a")


def test_valid_files_load_as_before(tmp_path):
    rows = [{"q": f"q{i}", "a": i, "extra": [i]} for i in range(3)]
    forms = {
        "lines.jsonl": "\n".join(json.dumps(r) for r in rows),
        "array.json": json.dumps(rows),
        "lines.json": "\ufeff" + "\n\n".join(json.dumps(r) for r in rows) + "\n",  # byte-order mark, blank line
    }
    for name, text in forms.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        got = _load(tmp_path / name, prompt_field="q", answer_field="a")
        assert [(r["prompt"], r["answer"], r["extra"]) for r in got] == [(f"q{i}", str(i), [i])
                                                                         for i in range(3)], name
    # one object of columns is one record of lists to `datasets` (its prompt was the text "['q0', ...]")
    columns = tmp_path / "columns.json"
    for indent, where in ((None, r"record 0 \(line 1\)"), (1, "record 0")):
        columns.write_text(json.dumps({k: [r[k] for r in rows] for k in rows[0]}, indent=indent))
        with pytest.raises(ConfigError, match=where + r": its 'q' field is a list"):
            _load(columns, prompt_field="q", answer_field="a")


def _encoder():
    return Encoder(builtin_tokenizer())


def test_long_prompts_are_refused_with_index_and_lengths_or_dropped(caplog):
    enc = _encoder()
    records = [{"prompt": "short", "answer": "1"}, {"prompt": "x" * 60, "answer": "2"},
               {"prompt": "y" * 70, "answer": "3"}]
    n = len(enc.prompt_ids("x" * 60))
    limit = PromptLimit.of(context=64, max_new_tokens=16, prompt_buckets=(16, 32))
    assert (limit.tokens, limit.why) == (32, "the largest rollout.prompt_buckets")
    assert PromptLimit.of(context=64, max_new_tokens=16).why == \
        "the model's context of 64 tokens less rollout.max_new_tokens=16"
    with pytest.raises(ConfigError) as e:
        check_prompt_lengths(records, enc, limit)
    assert str(e.value) == (f"data: record 1's prompt is {n} tokens (chat template included), longer than 32 "
                            "(the largest rollout.prompt_buckets); shorten it, or set "
                            "data.on_long_prompt=drop to leave such records out")
    drop = PromptLimit(32, "why", on_long="drop")
    with caplog.at_level(logging.WARNING, logger="jaxrl.data.pipeline"):
        assert check_prompt_lengths(records, enc, drop) == records[:1]
    assert "dropped 2 of 3 records whose prompt is longer than 32 tokens" in caplog.text
    with pytest.raises(ConfigError, match="every one of the 2 records has a prompt longer than 32 tokens"):
        check_prompt_lengths(records[1:], enc, drop)
    # before the split, so the held-out set keeps its size
    train, held = make_splits("arithmetic", train_size=20, eval_size=4, seed=0, encoder=enc,
                              prompt_limit=PromptLimit(1000, "why"))
    assert len(held) == 4 and len(train) > 0


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_cli_refuses_bad_data_before_compiling(tmp_path, capsys):
    """Through `jaxrl train`: exit 2, one line, and no checkpoint or metric written (nothing compiled)."""
    cfg = T.write_config(tmp_path)
    bad = _jsonl(tmp_path / "bad.jsonl", json.dumps(GOOD), json.dumps({"prompt": "What is 2 + 2?"}))
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--set", f"data.source={bad}"]) == 2
    assert "record 1 (line 2): its 'answer' field (data.answer_field) is missing" in _one_line(capsys)
    long = _jsonl(tmp_path / "long.jsonl", *[json.dumps({"prompt": f"What is {i} + 1?" + " pad" * (i % 2) * 9,
                                                          "answer": str(i + 1)}) for i in range(12)])
    argv = ["train", str(cfg), "--run-dir", str(run_dir), "--set", f"data.source={long}",
            "--set", "data.eval_size=2"]
    assert main(argv) == 2
    err = capsys.readouterr().err  # the file itself was read: `datasets` drew its progress bar first
    assert "Traceback" not in err
    err = err.strip().splitlines()[-1]
    assert err.startswith("jaxrl train: error: data: record 1's prompt is") and "longer than 32 (the largest rollout.prompt_buckets)" in err
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    assert main(argv + ["--set", "data.on_long_prompt=maybe"]) == 2
    assert "data.on_long_prompt" in _one_line(capsys)
