"""jaxrl model checkpoints: save/load round trip, trainer run/step layouts, config JSON, error messages."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from jaxrl.io import model_io
from jaxrl.errors import CheckpointError
from jaxrl.models import Llama3RopeScaling, Transformer, TransformerConfig

TOKENS = jnp.array([[1, 5, 9, 3, 7], [4, 4, 2, 8, 1]])


def _model(**changes):
    return Transformer(TransformerConfig.tiny(**changes), rngs=nnx.Rngs(3))


def _params(model):
    return nnx.state(model, nnx.Param).to_pure_dict()


def test_config_json_round_trip_with_nested_and_tuple_fields():
    cfg = TransformerConfig.tiny(norm="siamese", rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 64),
                                 eos_token_id=(2, 3), qk_norm=True)
    data = json.loads(json.dumps(model_io.config_to_json(cfg)))
    assert model_io.config_from_json(data) == cfg


def test_the_attention_kernel_is_not_saved():
    """It belongs to the machine (cuDNN on a GPU): a checkpoint written there loads on a CPU with "xla", and
    `jaxrl.io.build.build_model` applies the loading machine's `model.attention`."""
    data = model_io.config_to_json(TransformerConfig.tiny(attention="cudnn"))
    assert "attention" not in data
    assert model_io.config_from_json(data).attention == "xla"


def test_config_json_rejects_unknown_and_invalid_fields():
    data = model_io.config_to_json(TransformerConfig.tiny())
    with pytest.raises(CheckpointError, match=r"x.json: unknown TransformerConfig fields \['hiden_size'\]"):
        model_io.config_from_json({**data, "hiden_size": 3}, where="x.json")
    with pytest.raises(CheckpointError, match="x.json: invalid model config: .*norm='sandwich'"):
        model_io.config_from_json({**data, "norm": "sandwich"}, where="x.json")


def test_save_load_round_trip_exact(tmp_path):
    model = _model(norm="post")
    model_io.save_model_checkpoint(model, tmp_path / "ckpt")
    loaded, tokenizer = model_io.load_model_checkpoint(tmp_path / "ckpt")
    assert tokenizer is None and loaded.cfg == model.cfg
    for a, b in zip(_leaves(model), _leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(model(TOKENS)), np.asarray(loaded(TOKENS)))


def _leaves(model):
    return jax.tree.leaves(_params(model))


def test_load_with_dtype_override(tmp_path):
    model = _model()
    model_io.save_model_checkpoint(model, tmp_path / "ckpt")
    loaded, _ = model_io.load_model_checkpoint(tmp_path / "ckpt", dtype="bfloat16")
    assert loaded.cfg.param_dtype == "bfloat16" and loaded.cfg.dtype == "bfloat16"
    assert {leaf.dtype for leaf in _leaves(loaded)} == {jnp.dtype("bfloat16")}
    want = np.asarray(_leaves(model)[0]).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(_leaves(loaded)[0]), want)


def _trainer_run(tmp_path, models_by_step):
    """A run directory as the trainer writes it: CheckpointManager steps with a `params` item."""
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    first = next(iter(models_by_step.values()))
    (ckpts / model_io.CONFIG_FILE).write_text(json.dumps(model_io.config_to_json(first.cfg)))
    with ocp.CheckpointManager(ckpts, item_names=("params",)) as manager:
        for step, model in models_by_step.items():
            manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(_params(model))))
        manager.wait_until_finished()
    return tmp_path / "run"


@pytest.mark.parametrize("which", ["run", "checkpoints", "step"])
def test_load_trainer_layouts(tmp_path, which):
    early, late = _model(), Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(9))
    run = _trainer_run(tmp_path, {10: early, 20: late})
    path = {"run": run, "checkpoints": run / "checkpoints", "step": run / "checkpoints" / "10"}[which]
    want = early if which == "step" else late  # run / checkpoints resolve to the latest step
    loaded, _ = model_io.load_model_checkpoint(path)
    np.testing.assert_array_equal(np.asarray(loaded(TOKENS)), np.asarray(want(TOKENS)))


def test_load_errors(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        model_io.load_model_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is not a jaxrl checkpoint"):
        model_io.load_model_checkpoint(tmp_path / "empty")
    model_io.save_model_checkpoint(_model(), tmp_path / "ckpt")
    cfg_file = tmp_path / "ckpt" / model_io.CONFIG_FILE
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "hidden_size": 48}))
    with pytest.raises(CheckpointError, match="cannot restore parameters from .*params"):
        model_io.load_model_checkpoint(tmp_path / "ckpt")
    cfg_file.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read .*model_config.json"):
        model_io.load_model_checkpoint(tmp_path / "ckpt")


def test_save_is_atomic_and_refuses_to_clobber(tmp_path):
    model = _model()
    model_io.save_model_checkpoint(model, tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        model_io.save_model_checkpoint(model, tmp_path / "ckpt")

    class BrokenTokenizer:
        def save_pretrained(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        model_io.save_model_checkpoint(model, tmp_path / "other", tokenizer=BrokenTokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
