"""Sampling from a sharded tiny model (FSDP+TP on 8 fake CPU devices) gives the single-device tokens."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl.models import Transformer, TransformerConfig
from jaxrl.sampling import generate_from_state
from jaxrl.sharding import FSDP_TP, MeshConfig, make_constrain, make_mesh, no_constraint, state_shardings

CFG = TransformerConfig.tiny(num_kv_heads=4)
PROMPTS = [[1, 5, 9, 13], [1, 7], [1, 3, 3, 3, 8, 2], [1, 60]]


@pytest.mark.slow  # two sampler compilations; ~20-40 s on the shared 2-core machine
def test_sharded_sampling_gives_single_device_tokens():
    kw = dict(max_new_tokens=6, num_samples=2, temperature=1.0, seed=3, prompt_buckets=(8,), gen_buckets=(8,))
    graphdef, state = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0), constrain=no_constraint))
    ref = generate_from_state(graphdef, state, PROMPTS, **kw)

    mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=4, rules="fsdp_tp"))
    graphdef, state = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0), constrain=make_constrain(mesh, FSDP_TP)))
    state = jax.device_put(state, state_shardings(state, mesh, FSDP_TP))
    out = generate_from_state(graphdef, state, PROMPTS, batch_sharding=NamedSharding(mesh, P("data")), **kw)

    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), rtol=1e-5, atol=1e-5)
