"""`jaxrl sample` end to end on a tiny random model carrying the real SmolLM2 tokenizer and chat template."""

import shutil

import numpy as np
import pytest

from jaxrl import cli, sampling

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import transformers

    from jaxrl.io.gguf import ensure_smollm2_hf_dir

    src = ensure_smollm2_hf_dir("float32")
    out = tmp_path_factory.mktemp("tiny_smol")
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=8, max_position_embeddings=256, tie_word_embeddings=True,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, out / name)
    return out


def test_sample_prints_the_generated_completions(model_dir, capsys):
    from jaxrl.commands.sample import encode_prompts, stop_ids
    from jaxrl.io.model_io import load_model

    rc = cli.main(["sample", "--checkpoint", str(model_dir), "--prompt", "Hello there", "--prompt", "2+2?",
                   "--chat", "--num-samples", "2", "--max-new-tokens", "6", "--temperature", "0.8",
                   "--seed", "4"])
    assert rc == 0
    printed = capsys.readouterr().out
    model, tok = load_model(model_dir)
    ids = encode_prompts(tok, ["Hello there", "2+2?"], chat=True)
    text = tok.decode(ids[0])
    assert "<|im_start|>user\nHello there<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    gen = sampling.generate(model, ids, max_new_tokens=6, num_samples=2, temperature=0.8, seed=4,
                            eos_ids=stop_ids(tok, model_dir), pad_id=tok.pad_token_id)
    blocks = printed.split("=== ")[1:]
    assert len(blocks) == 4
    for row, block in enumerate(blocks):
        header, text = block.split(" ===\n", 1)
        n = int(gen.lengths[row])
        assert header.startswith(f"prompt {row // 2} sample {row % 2} ({n} tokens")
        assert text == tok.decode(np.asarray(gen.tokens[row, :n]).tolist(), skip_special_tokens=True) + "\n"


@pytest.mark.parametrize("extra,message", [
    (["--num-samples", "0"], "num_samples must be >= 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
])
def test_bad_settings_exit_2_with_one_line(model_dir, capsys, extra, message):
    rc = cli.main(["sample", "--checkpoint", str(model_dir), "--prompt", "hi", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_missing_checkpoint_is_a_user_error(tmp_path, capsys):
    rc = cli.main(["sample", "--checkpoint", str(tmp_path / "nope"), "--prompt", "hi"])
    assert rc == 2 and "no such file or directory" in capsys.readouterr().err
