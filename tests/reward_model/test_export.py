"""RM scores equal transformers' `*ForSequenceClassification` after export (fp32, atol 1e-4), and
round-trip."""

import numpy as np
import pytest
from flax import nnx

from jaxrl.errors import CheckpointError
from jaxrl.models import TransformerConfig
from jaxrl.reward_model.export import export_reward_model, import_reward_model
from jaxrl.reward_model.model import RewardModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIGS = {
    "llama": TransformerConfig.tiny(),
    "qwen2": TransformerConfig.tiny(family="qwen2", qkv_bias=True),
    "qwen3": TransformerConfig.tiny(family="qwen3", qk_norm=True),
}


def _tokens():
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 64, size=(4, 9)).astype(np.int32)
    ids[0, 6:] = 0        # right padding
    ids[1, :3] = 0        # left padding
    ids[2, 1:] = 0        # a single real token
    return ids


def _random_rm(cfg, seed=0):
    rm = RewardModel(cfg, rngs=nnx.Rngs(seed))
    # A larger head than the N(0, 0.02) init, so the comparison is not dominated by near-zero scores.
    rm.score = nnx.Param(rm.score[...] * 50)
    return rm


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_scores_match_transformers(family, tmp_path):
    rm = _random_rm(CONFIGS[family])
    export_reward_model(rm, tmp_path / "hf")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    hf.eval()
    assert type(hf).__name__ == {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family] + \
        "ForSequenceClassification"
    assert hf.config.num_labels == 1 and hf.config.pad_token_id == 0
    ids = _tokens()
    mask = (ids != 0).astype(np.int64)
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids.astype(np.int64)),
                  attention_mask=torch.from_numpy(mask)).logits
    ours, _ = rm(ids, mask)
    assert want.shape == (4, 1)
    np.testing.assert_allclose(np.asarray(ours), want[:, 0].numpy(), atol=1e-4, rtol=0)
    assert np.ptp(np.asarray(ours)) > 1e-2  # the rows really differ


def test_import_round_trip_is_exact(tmp_path):
    rm = _random_rm(CONFIGS["qwen3"], seed=3)
    export_reward_model(rm, tmp_path / "hf")
    back = import_reward_model(tmp_path / "hf")
    ids = _tokens()
    np.testing.assert_array_equal(np.asarray(back(ids)[0]), np.asarray(rm(ids)[0]))


def test_siamese_rm_cannot_be_exported(tmp_path):
    rm = RewardModel(TransformerConfig.tiny(norm="siamese"), rngs=nnx.Rngs(0))
    with pytest.raises(CheckpointError, match="siamese-norm reward model"):
        export_reward_model(rm, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_import_rejects_causal_lm(tmp_path):
    from jaxrl.io.hf import save_pretrained
    from jaxrl.models import Transformer

    save_pretrained(Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0)), tmp_path / "lm")
    with pytest.raises(CheckpointError, match="LlamaForCausalLM.*not a supported reward model"):
        import_reward_model(tmp_path / "lm")
