"""Multi-agent systems that read a built-in world refuse, at setup, data they cannot use (issue 30 item 8):
records without the world's question fields (a user JSONL of plain prompts: MARCH used to stop with a
`KeyError` after the warm start) and questions over another world (every one unanswerable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl.data.entities import build_world
from jaxrl.errors import ConfigError
from jaxrl.multi_agent.march import MarchSystem
from jaxrl.multi_agent.ssp import SspSystem
from jaxrl.io.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin")


@pytest.mark.parametrize("system", [MarchSystem, SspSystem])
def test_questions_of_another_world_are_refused(tok, system):
    own = build_world(0, "rooms").records("train")[:20]
    other = build_world(1, "rooms").records("train")[:20]
    made = system(tok, corpus_seed=0, corpus_size="rooms")
    made.check_records(own, "train")  # the world's own questions pass
    name = "MARCH" if system is MarchSystem else "SSP"
    with pytest.raises(ConfigError, match=rf"^data: held-out record 0 asks about '\w+', who is not in {name}'s "
                                          r"world \(corpus_seed=0, corpus_size='rooms'\)"):
        made.check_records(other, "held-out")
    with pytest.raises(ConfigError, match=r"^data: train record 3 has fields \['answer', 'prompt'\]; "):
        made.check_records(own[:3] + [{"prompt": "What is 1 + 1?", "answer": "2"}], "train")


def test_march_on_plain_jsonl_prompts_is_one_line_before_anything_compiles(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is the room of Qazev{i}?", "answer": str(i % 10)}) + "\n"
                            for i in range(40)))
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", str(ROOT / "configs/march_tiny.yaml"), "--run-dir",
           str(tmp_path / "run")]
    for o in (f"data.source={data}", "data.params={}", "data.train_size=32", "data.eval_size=8",
              "sft_warmup.steps=0", "train.steps=1", "logging.progress_bar=false"):
        cmd += ["--set", o]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("jaxrl train: error: ")]
    assert errors == ["jaxrl train: error: data: train record 0 has fields ['answer', 'prompt']; MARCH reads "
                      "questions over its world with fields question, chain, answers (as data.source: entities "
                      "makes them)"], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "checkpoints").exists()
