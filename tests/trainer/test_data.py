"""Built-in tokenizer, generators, splits, the resumable per-host grain iterator and prompt padding."""

import json

import numpy as np
import pytest

from jaxrl.config import DataConfig
from jaxrl.data import Encoder, arithmetic, countdown, eval_batches, make_splits, train_iterator
from jaxrl.errors import ConfigError, UserError
from jaxrl.rewards import countdown as countdown_reward
from jaxrl.rewards import math_answer
from jaxrl.io.tokenizer import builtin_tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def encoder():
    return Encoder(builtin_tokenizer())


def test_builtin_tokenizer_round_trip_and_ids():
    tok = builtin_tokenizer()
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (0, 1, 6 + 96)
    text = "What is 23 + 58?\n<answer>81</answer>"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert ids[:2] == [6 + 1 + ord("W") - 32, 6 + 1 + ord("h") - 32]  # "\n" is id 6, then ASCII from space
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|user|>hi<|assistant|>"
    assert tok.decode(tok.encode(chat, add_special_tokens=False)) == chat
    assert tok.decode(tok.encode("é", add_special_tokens=False)) == "<|unk|>"
    with pytest.raises(ConfigError, match="tokenizer.path"):
        load_tokenizer("hf", "/nonexistent/dir")


def test_generators_are_deterministic_and_correct():
    assert arithmetic(50, 3) == arithmetic(50, 3) and arithmetic(50, 3) != arithmetic(50, 4)
    recs = arithmetic(200, 0, max_operand=9, ops="+-*")
    for r in recs:
        a, op, b = r["prompt"][len("What is ") : -1].split()
        assert int(r["answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] >= 0
    assert (
        math_answer(
            [""] * 200, [f"<answer>{r['answer']}</answer>" for r in recs], answer=[r["answer"] for r in recs]
        )
        == [1.0] * 200
    )
    cd = countdown(100, 0, num_numbers=4, max_number=12)
    assert (
        countdown_reward(
            [""] * 100,
            [f"<answer>{r['answer']}</answer>" for r in cd],
            numbers=[r["numbers"] for r in cd],
            target=[r["target"] for r in cd],
        )
        == [1.0] * 100
    )
    with pytest.raises(ConfigError, match="data.params.ops"):
        arithmetic(1, 0, ops="^")


def test_splits_hold_out_distinct_prompts():
    train, held = make_splits("arithmetic", train_size=500, eval_size=40, seed=1, params={"max_operand": 9})
    assert len(held) == 40 and not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert len({r["prompt"] for r in train}) == len(train)
    again = make_splits("arithmetic", train_size=500, eval_size=40, seed=1, params={"max_operand": 9})
    assert (train, held) == again
    with pytest.raises(ConfigError, match="none left to train on"):
        make_splits("arithmetic", train_size=10, eval_size=500, seed=0, params={"max_operand": 3})


def test_file_sources(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"q{i}", "a": str(i), "extra": i}) for i in range(10)))
    train, held = make_splits(
        str(path), train_size=1, eval_size=2, seed=0, prompt_field="q", answer_field="a"
    )
    assert len(train) == 8 and len(held) == 2
    assert all(r["answer"] == r["prompt"][1:] and r["extra"] == int(r["answer"]) for r in train + held)
    with pytest.raises(ConfigError, match="data.prompt_field='question': not a column"):
        make_splits(str(path), train_size=1, eval_size=2, seed=0, prompt_field="question")
    with pytest.raises(ConfigError, match="no such file"):
        make_splits(str(tmp_path / "x.parquet"), train_size=1, eval_size=0, seed=0)
    with pytest.raises(ConfigError, match="data.source='nosuch'"):
        make_splits("nosuch", train_size=1, eval_size=0, seed=0)


def test_encoder_targets(encoder):
    rec = encoder({"prompt": "What is 1 + 2?", "answer": "3"})
    tok = encoder.tokenizer
    assert tok.decode(rec["prompt_ids"]) == "<|user|>What is 1 + 2?<|assistant|>"
    assert rec["sft_target"] == "<answer>3</answer>" and rec["target_ids"][-1] == tok.eos_token_id
    assert tok.decode(rec["target_ids"][:-1]) == rec["sft_target"]
    latex = Encoder(tok, system_prompt="Be brief.", target_format="\\boxed{{answer}}")
    assert latex({"prompt": "x", "answer": "\\frac{1}{2}"})["sft_target"] == "\\boxed{\\frac{1}{2}}"
    assert tok.decode(latex.prompt_ids("x")) == "<|system|>Be brief.<|user|>x<|assistant|>"
    # dataset fields survive encoding: a countdown record keeps its numeric `target` for the reward
    cd = encoder({"prompt": "Make 7", "answer": "3 + 4", "numbers": [3, 4], "target": 7})
    assert cd["target"] == 7 and cd["numbers"] == [3, 4] and cd["sft_target"] == "<answer>3 + 4</answer>"


def test_encoder_mixed_target_formats(encoder):
    formats = ("<answer>{answer}</answer>", "The answer is {answer}.", "{answer}")
    enc = Encoder(encoder.tokenizer, target_formats=formats)
    rec = {"prompt": "What is 1 + 2?", "answer": "3"}
    targets = [enc(rec, k)["sft_target"] for k in range(300)]
    assert targets == [enc(rec, k)["sft_target"] for k in range(300)]  # deterministic in (prompt, variant)
    counts = {f.replace("{answer}", "3"): targets.count(f.replace("{answer}", "3")) for f in formats}
    assert sum(counts.values()) == 300 and min(counts.values()) >= 70, counts  # every style, roughly evenly
    assert encoder(rec, 5)["sft_target"] == "<answer>3</answer>"  # a single target_format ignores the variant
    with pytest.raises(ConfigError, match=r"data.target_formats\[1\]"):
        DataConfig(target_formats=("<answer>{answer}</answer>", "no placeholder"))


def _prompts(it, n):
    return [[r["prompt"] for r in next(it)] for _ in range(n)]


def test_iterator_state_restores_the_same_batches(encoder):
    records = arithmetic(30, 0)
    it = train_iterator(records, encoder, batch_size=4, seed=7)
    _prompts(it, 3)
    state = json.loads(json.dumps(it.get_state()))  # must survive JSON (checkpoint `extra`)
    expected = _prompts(it, 12)  # 48 items: crosses epoch boundaries (30 records)
    fresh = train_iterator(records, encoder, batch_size=4, seed=7)
    fresh.set_state(state)
    assert _prompts(fresh, 12) == expected
    epoch1 = [p for b in _prompts(train_iterator(records, encoder, batch_size=5, seed=7), 12) for p in b]
    assert sorted(epoch1[:30]) == sorted(r["prompt"] for r in records)  # each epoch is a permutation
    assert epoch1[:30] != epoch1[30:60]  # ... reshuffled per epoch


def test_one_prompt_per_step_is_the_same_stream(encoder):
    """data.prompts_per_step=1 (grain's batch of 1 over the endless stream overflowed): batches of one record
    in the order of any other batch size, and the state restores."""
    records = arithmetic(7, 0)
    ones = [b[0] for b in _prompts(train_iterator(records, encoder, batch_size=1, seed=3), 20)]
    pairs = [p for b in _prompts(train_iterator(records, encoder, batch_size=2, seed=3), 10) for p in b]
    assert ones == pairs
    it = train_iterator(records, encoder, batch_size=1, seed=3)
    _prompts(it, 9)
    state = json.loads(json.dumps(it.get_state()))
    fresh = train_iterator(records, encoder, batch_size=1, seed=3)
    fresh.set_state(state)
    assert _prompts(fresh, 5) == _prompts(it, 5)


def test_per_host_blocks_make_the_one_host_batches(encoder):
    """Host p of N reads block p of every global batch: concatenated in process order, the hosts' batches
    are the one-process batches (so 2 processes train on exactly what 1 does); disjoint within a step."""
    records = arithmetic(24, 1)
    whole = _prompts(train_iterator(records, encoder, batch_size=6, seed=0), 9)  # crosses an epoch
    parts = [_prompts(train_iterator(records, encoder, batch_size=6, seed=0, process_index=host,
                                     process_count=3), 9) for host in range(3)]
    assert all(len(b) == 2 for p in parts for b in p)
    assert [sum((p[k] for p in parts), []) for k in range(9)] == whole
    assert all(len(set(sum((p[k] for p in parts), []))) == 6 for k in range(9))
    it = train_iterator(records, encoder, batch_size=6, seed=0, process_index=1, process_count=3)
    _prompts(it, 5)
    state = json.loads(json.dumps(it.get_state()))
    one = train_iterator(records, encoder, batch_size=6, seed=0)
    _prompts(one, 5)
    assert state == json.loads(json.dumps(one.get_state()))  # one position for all hosts
    with pytest.raises(ConfigError, match="not divisible"):
        train_iterator(records, encoder, batch_size=7, seed=0, process_count=3)


def test_eval_batches_and_pad_prompts(encoder):
    from jaxrl.sampling import pad_prompts

    batches = eval_batches(arithmetic(5, 0), encoder, 2)
    assert [len(b) for b in batches] == [2, 2, 1]
    tokens_PL, mask_PL = pad_prompts([[5, 6, 7], [8]], [2, 4, 8], pad_id=0)
    np.testing.assert_array_equal(tokens_PL, [[0, 5, 6, 7], [0, 0, 0, 8]])
    np.testing.assert_array_equal(mask_PL, [[0, 1, 1, 1], [0, 0, 0, 1]])
    assert tokens_PL.dtype == np.int32 and pad_prompts([[1, 2, 3]], None, 0)[0].shape == (1, 3)
    with pytest.raises(UserError, match="prompt of 5 tokens exceeds the largest prompt bucket \\(4\\)"):
        pad_prompts([[1] * 5], [2, 4], 0)


def test_builtin_tokenizer_survives_save_pretrained(tmp_path):
    from transformers import AutoTokenizer

    tok = builtin_tokenizer()
    tok.save_pretrained(str(tmp_path))
    again = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2 + 2?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert again.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == text
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert (again.pad_token_id, again.eos_token_id, len(again)) == (0, 1, len(tok))
