"""Fixtures of tests/train: the tiny model's parts, shared by the packing tests."""

import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig


@pytest.fixture(scope="module")
def model_parts():
    """(graphdef, pure parameter dict) of the tiny model, seed 0 (one per test module)."""
    model = Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    return graphdef, state.to_pure_dict()
