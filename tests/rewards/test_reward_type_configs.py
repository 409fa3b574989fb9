"""The example configs of the model-judged reward types train one step (`jaxrl train CONFIG --set ...`): a
tiny local judge for configs/openrs_judge_tiny.yaml, a stub proxy for configs/proxy_grm_tiny.yaml, and
configs/evpv_tiny.yaml as it is; each reward is scored without errors."""

import json
import math
from pathlib import Path

import pytest
from flax import nnx

from jaxrl.io import model_io
from jaxrl.cli import main
from jaxrl.config import load_config
from jaxrl.models import Transformer, TransformerConfig
from jaxrl.rewards import resolve
from jaxrl.io.tokenizer import builtin_tokenizer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# one policy layer, D = 32 (the configs' 4 layers of D = 128 made the step's compile most of each test); the
# configs' own max_position_embeddings stay (dotted keys merge into model.overrides)
SMALL_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2, "head_dim": 16, "mlp_dim": 64}
SHORT = ["--set", "train.steps=1", "--set", "sft_warmup.steps=0", "--set", "train.eval_every=0",
         "--set", "data.train_size=32", "--set", "data.eval_size=4", "--set", "logging.progress_bar=false",
         "--set", "checkpoint.async_save=false",
         *[a for k, v in SMALL_MODEL.items() for a in ("--set", f"model.overrides.{k}={v}")]]


def proxy_texts(requests):
    """A proxy that always picks response 1."""
    return ["<think>rubric applied</think><answer>1</answer>"] * len(requests)


def _tiny_judge(path):
    tok = builtin_tokenizer()
    cfg = TransformerConfig.tiny(vocab_size=len(tok), num_layers=1, max_position_embeddings=256,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return str(model_io.save_model_checkpoint(Transformer(cfg, rngs=nnx.Rngs(0)), path, tokenizer=tok))


def _pairs(path, n=24):
    """Arithmetic preference pairs: one response right, one off by one; `answer` names the right one."""
    rows = []
    for i in range(n):
        a, b = 10 + i, i % 4
        right, wrong = f"{a} + {b} = {a + b}", f"{a} + {b} = {a + b + 1}"
        first, second = (right, wrong) if i % 2 else (wrong, right)
        rows.append({"prompt": f"Question: What is {a} + {b}?\nResponse 1: {first}\nResponse 2: {second}\n"
                               "Which response is better?", "answer": "1" if i % 2 else "2",
                     "question": f"What is {a} + {b}?", "response_1": first, "response_2": second})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _train(config, run, overrides):
    assert main(["train", str(CONFIGS / config), "--run-dir", str(run), *SHORT, *overrides]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if any(k.startswith("reward/") for k in r))


@pytest.mark.parametrize("config", ["openrs_judge_tiny.yaml", "proxy_grm_tiny.yaml", "evpv_tiny.yaml"])
def test_example_configs_load_and_name_the_new_types(config):
    types = {r.type for r in load_config(CONFIGS / config).rewards}
    assert types & {"pairwise", "proxy_grm", "evpv"}


def test_evpv_config_resolves_as_shipped():
    cfg = load_config(CONFIGS / "evpv_tiny.yaml")
    assert resolve(cfg.rewards).names == ("answer", "prm")


@pytest.mark.slow
def test_openrs_judge_config_trains_one_step_with_a_local_judge(tmp_path):
    judge = _tiny_judge(tmp_path / "judge")
    row = _train("openrs_judge_tiny.yaml", tmp_path / "run", [
        "--set", f"rewards.judge.params.judge={{model: {judge}, max_new_tokens: 8, batch_size: 16}}",
        "--set", 'rewards.judge.params.prompt_template="Q:{query}\\nA:{response_a}\\nB:{response_b}\\n"'])
    assert row["reward/judge/errors"] == 0 and math.isfinite(row["reward/judge/mean"])


@pytest.mark.slow
def test_proxy_grm_config_trains_one_step(tmp_path):
    row = _train("proxy_grm_tiny.yaml", tmp_path / "run", [
        "--set", f"data.source={_pairs(tmp_path / 'pairs.jsonl')}",
        "--set", f"rewards.grm.params.proxy={{generate: '{__name__}:proxy_texts'}}"])
    assert row["reward/grm/errors"] == 0
    # r_acc, r_proxy ∈ {±1}, 0.5·r_fmt ∈ {0, 0.5}: every sample's R lies in [−2, 2.5]
    assert -2.0 <= row["reward/grm/mean"] <= 2.5


@pytest.mark.slow
def test_evpv_config_trains_one_step(tmp_path):
    row = _train("evpv_tiny.yaml", tmp_path / "run", [])
    assert row["reward/prm/errors"] == 0 and -1.0 <= row["reward/prm/mean"] <= 1.0
