"""Greedy `generate` equals transformers `generate(do_sample=False)` token for token (left-padded batches)."""

import numpy as np
import pytest

from jaxrl import sampling
from jaxrl.models import Transformer, hf_io, testing

torch = pytest.importorskip("torch")

FAMILIES = ["llama_untied", "llama_tied", "qwen2_bias", "qwen3_qk_norm"]
PROMPTS = [[5, 9, 3, 17], [7, 1, 4, 4, 8, 12, 30, 41, 6], [11], [23, 6, 20, 21, 22, 9]]


def _hf_greedy(hf_model, prompts, max_new_tokens, eos_token_id=None):
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    with torch.no_grad():
        out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                do_sample=False, eos_token_id=eos_token_id, pad_token_id=0)
    return out[:, width:].numpy()


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_equals_transformers_on_tiny_models(name):
    cfg = testing.TINY_CONFIGS[name]
    hf_model = testing.random_hf_model(cfg, seed=3)
    with torch.no_grad():  # spread the logits so near-ties cannot flip an argmax between two fp32 programs
        hf_model.get_output_embeddings().weight.mul_(30.0)
    sd = testing.state_dict_numpy(hf_model)
    model = Transformer.from_params(cfg, hf_io.hf_to_params(cfg, sd.__getitem__))
    expected = _hf_greedy(hf_model, PROMPTS, 10)
    gen = sampling.generate(model, PROMPTS, max_new_tokens=10, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(gen.tokens), expected)
    assert len({tuple(r) for r in expected.tolist()}) > 1


@pytest.mark.slow
def test_greedy_equals_transformers_on_smollm2():
    import transformers

    from jaxrl.io import hf
    from jaxrl.io.gguf import ensure_smollm2_hf_dir

    path = ensure_smollm2_hf_dir("float32")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    questions = ["What is the capital of France?", "Name three primary colors.", "Hi"]
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=True)["input_ids"]) for q in questions]
    assert len(set(map(len, prompts))) == 3
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = _hf_greedy(hf_model, prompts, 24, eos_token_id=eos)
    model = hf.from_pretrained(path, dtype="float32")
    gen = sampling.generate(model, prompts, max_new_tokens=24, temperature=0.0, eos_ids=(eos,), pad_id=0)
    np.testing.assert_array_equal(np.asarray(gen.tokens)[:, :expected.shape[1]], expected)
    assert "Paris" in tok.decode(np.asarray(gen.tokens[0]).tolist())
