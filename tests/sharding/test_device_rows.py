"""A rollout's tokens stay on the devices (`jaxrl.sharding.rows`, `jaxrl.rl.collect.sample_and_score`).

On 8 fake CPU devices: the row operations the RL step uses (DAPO's take and concat, prompt re-padding,
mini-batch gathers) on a batch-sharded global array equal numpy's bit for bit and keep the rows split over
the batch axis; `collect` on a sharded model returns its token and log-prob arrays as global arrays laid out
like the sampler's rows, equal to the host-built `sequences` of the same generation.
"""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl.rl.collect import sample_and_score
from jaxrl.sampling import rollout_rows
from jaxrl.sharding import MeshConfig, hosts, make_mesh, rows


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(data=2, fsdp=4))


def _global(x, mesh):
    return hosts.host_to_global(x, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))


def test_row_operations_equal_numpy_and_keep_the_batch_split(mesh):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 1000, (16, 5)).astype(np.int32)
    b = rng.normal(size=(8, 5)).astype(np.float32)
    ga, gb = _global(a, mesh), _global(b.astype(np.int32), mesh)
    order = rng.permutation(16)[:8]
    took = rows.take(ga, order)
    np.testing.assert_array_equal(np.asarray(took), a[order])
    assert took.sharding.spec == ga.sharding.spec  # 8 rows still split over the 8 devices
    cat = rows.concat([ga, gb])
    np.testing.assert_array_equal(np.asarray(cat), np.concatenate([a, b.astype(np.int32)]))
    assert cat.sharding.spec == ga.sharding.spec
    mixed = rows.concat([ga, b.astype(np.int32)])  # a host part joins a device part
    np.testing.assert_array_equal(np.asarray(mixed), np.asarray(cat))
    padded = rows.pad_columns(ga, 3, 1, -7)
    np.testing.assert_array_equal(np.asarray(padded), np.pad(a, ((0, 0), (3, 1)), constant_values=-7))
    odd = rows.take(ga, np.arange(3))  # 3 rows cannot split over 8 devices: replicated, values intact
    np.testing.assert_array_equal(np.asarray(odd), a[:3])
    assert odd.sharding.is_fully_replicated
    # host arrays take the numpy path and stay numpy
    assert isinstance(rows.take(a, order), np.ndarray) and isinstance(rows.concat([a, a]), np.ndarray)


def test_collect_leaves_tokens_on_the_devices(mesh):
    from flax import nnx

    from jaxrl import rewards as rewards_lib
    from jaxrl.config import RewardSpec
    from jaxrl.models import Transformer, TransformerConfig
    from jaxrl.sampling import SamplingSpec, generate_from_state
    from jaxrl.sharding import RULES, make_constrain, state_shardings
    from jaxrl.io.tokenizer import builtin_tokenizer

    tok = builtin_tokenizer()
    cfg = TransformerConfig.tiny(vocab_size=len(tok), num_kv_heads=4, max_position_embeddings=64)
    model = Transformer(cfg, rngs=nnx.Rngs(0), constrain=make_constrain(mesh, RULES["fsdp"]))
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, state_shardings(state, mesh, RULES["fsdp"]))
    spec = SamplingSpec(max_new_tokens=6, num_samples=2, temperature=1.0, prompt_buckets=(16,))
    records = [{"prompt": p, "prompt_ids": tok.encode(p)} for p in ("ab", "cde", "f", "ghij")]
    rewards = rewards_lib.resolve([RewardSpec(name="len", type="length", params={"target": 3})])
    ro = sample_and_score(graphdef, state, records, tok, rewards, spec, seed=jax.random.key(3))
    assert isinstance(ro.tokens_BL, jax.Array) and isinstance(ro.old_logp_BT, jax.Array)
    assert len(ro.tokens_BL.sharding.device_set) == 8 and not ro.tokens_BL.sharding.is_fully_replicated
    assert isinstance(ro.mask_BL, np.ndarray) and isinstance(ro.completion_mask_BT, np.ndarray)
    # the same generation built on the host (the multi-agent path) gives the same arrays
    gen = generate_from_state(graphdef, state, [r["prompt_ids"] for r in records], spec,
                              eos_ids=(tok.eos_token_id,), seed=jax.random.key(3), pad_id=tok.pad_token_id)
    tokens, mask, cmask, old = rollout_rows.sequences([r["prompt_ids"] for r in records], gen, 2,
                                                     tok.pad_token_id, spec.prompt_buckets)
    np.testing.assert_array_equal(np.asarray(ro.tokens_BL), tokens)
    np.testing.assert_array_equal(ro.mask_BL, mask)
    np.testing.assert_array_equal(ro.completion_mask_BT, cmask)
    np.testing.assert_array_equal(np.asarray(ro.old_logp_BT), old)
    kept = rollout_rows.select_groups(ro, np.array([3, 1]), 2)  # DAPO keeps groups 3 and 1, on the devices
    np.testing.assert_array_equal(np.asarray(kept.tokens_BL), tokens[[6, 7, 2, 3]])
    assert [r["prompt"] for r in kept.records] == ["ghij", "ghij", "cde", "cde"]
