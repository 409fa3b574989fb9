"""The real SmolLM2-135M-Instruct (GGUF fixture -> HF dir): jaxrl logits equal transformers' on a chat prompt.

Measured (fp32, CPU, 31-token chat prompt, 30 layers): max |jaxrl - transformers| = 1.1e-4 over 2.06 M logits;
7 of them are above 1e-4. Both are fp32 rounding: against the same model run by transformers in float64,
transformers fp32 is off by up to 9.3e-5 and jaxrl fp32 by up to 1.15e-4, with equal mean error (1.21e-5).
So the test bounds jaxrl's error by transformers' own fp32 error against the float64 truth, instead of an
elementwise atol=1e-4 that a 30-layer fp32 model cannot meet on every logit.

That bound compares two backends' fp32 kernels, and they differ by machine. On the Sapphire Rapids CPU of
2026-11-26 (AVX-512 FP16, AMX) transformers' fp32 error fell to 6.0e-5 (mean 9.5e-6, 42-token prompt) while
jaxrl's stayed where it was (1.4e-4, mean 1.5e-5): XLA:CPU's fp32 dot there is 2.3x less accurate than torch's
sgemm on the same random operands (max error; 1.2x in the mean), which the probe below measures. Where XLA's
dot is that much worse (ratio > 1.5) the reference-relative asserts are an expected failure with the numbers
in the reason, and a bound scaled by the measured kernel ratio still holds the model to its kernels.
"""

import numpy as np
import pytest
import torch

from jaxrl.io import hf


def _fp32_dot_error_ratio() -> float:
    """Max |error| vs float64 of XLA:CPU's fp32 dot over torch's, on the same random [256, 576] x [576, 1536]
    operands (SmolLM2's hidden and MLP sizes)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 576)), rng.standard_normal((576, 1536))
    exact = a @ b
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ours = np.abs(np.asarray(jnp.asarray(a32) @ jnp.asarray(b32)) - exact).max()
    theirs = np.abs((torch.from_numpy(a32) @ torch.from_numpy(b32)).numpy() - exact).max()
    return float(ours / theirs)


@pytest.mark.slow
def test_smollm2_chat_logits_match_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    tokens = np.array([ids])
    assert len(ids) > 20

    torch_model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = torch_model(torch.tensor(tokens)).logits.numpy()
        exact = torch_model.double()(torch.tensor(tokens)).logits.numpy()  # float64 reference
    del torch_model

    model = hf.from_pretrained(smollm2_dir, dtype="float32")
    assert model.cfg.num_layers == 30 and model.cfg.tie_embeddings and model.cfg.rope_theta == 100000.0
    got = np.asarray(model(tokens))
    assert got.dtype == np.float32 and got.shape == want.shape == (1, len(ids), 49152)

    ours, theirs = np.abs(got - exact), np.abs(want - exact)
    assert theirs.max() < 1e-4  # sanity: the reference's own fp32 error on this prompt
    kernel = max(1.0, _fp32_dot_error_ratio())  # 1 where XLA's fp32 dot is as accurate as torch's
    assert ours.max() <= 1.5 * kernel * theirs.max()  # always: the model adds no error beyond its kernels'
    np.testing.assert_allclose(got, want, atol=2 * kernel * theirs.max(), rtol=0)
    try:
        assert ours.max() <= 1.5 * theirs.max() and ours.mean() <= 1.1 * theirs.mean()
        np.testing.assert_allclose(got, want, atol=2 * theirs.max(), rtol=0)
        assert np.mean(np.abs(got - want) <= 1e-4) > 0.99999
    except AssertionError:
        if kernel <= 1.5:
            raise
        pytest.xfail(f"XLA:CPU's fp32 dot is {kernel:.2f}x less accurate than torch's here: jaxrl max/mean "
                     f"error {ours.max():.3g}/{ours.mean():.3g}, transformers "
                     f"{theirs.max():.3g}/{theirs.mean():.3g}")
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    # The model is real: its greedy first answer token is "The" ("The capital of France is Paris.").
    assert tok.decode([int(got[0, -1].argmax())]).strip() == "The"
