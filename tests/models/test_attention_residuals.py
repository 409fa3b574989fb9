"""What a training forward keeps for the backward pass: without remat, two [B, K, G, L, L] attention tensors
per layer (scores and probabilities); with `remat: dots` or `full`, none (they are recomputed from q, k, v).
This is the memory lever for long sequences (benchmarks/RESULTS.md, long prompts); remat's logits and
gradients are checked in test_dtypes_remat.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl.models import Transformer, TransformerConfig

L = 24


def _residual_shapes(remat: str, scan_layers: bool) -> list[tuple[int, ...]]:
    """Shapes of the arrays the backward pass of a forward + loss keeps (the VJP closure's leaves)."""
    cfg = TransformerConfig.tiny(norm="pre", remat=remat, scan_layers=scan_layers)
    params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param).to_pure_dict()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, L)), jnp.int32)

    def loss(p):
        return jnp.mean(jax.nn.log_softmax(Transformer.from_params(cfg, p)(tokens))[..., 0])

    _, pullback = jax.vjp(loss, params)
    return [leaf.shape for leaf in jax.tree.leaves(pullback) if hasattr(leaf, "shape")]


def _square(shapes):
    return [s for s in shapes if len(s) > 3 and s[-2:] == (L, L)]


@pytest.mark.parametrize("scan_layers", [True, False])
def test_remat_drops_the_square_attention_residuals(scan_layers):
    assert _square(_residual_shapes("none", scan_layers)), "without remat the L x L tensors are kept"
    for remat in ("dots", "full"):
        kept = _residual_shapes(remat, scan_layers)
        assert kept, "no residuals found: the check would pass vacuously"
        assert not _square(kept), (remat, _square(kept))
