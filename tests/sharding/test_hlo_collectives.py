"""`jaxrl.plan.collectives` on programs whose collectives are known by hand (issue 32 item 1's parser test).

Each program is a `shard_map` over the 8 fake CPU devices (tests/conftest.py) that calls one collective on a
per-device block of known shape, so the compiled module must hold exactly that instruction with that result
size on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from jaxrl.plan.collectives import KINDS, array_bytes, collectives, upcast_bytes

N = 8  # devices


def _compiled_text(body, x) -> str:
    mesh = Mesh(np.array(jax.devices()[:N]), ("x",))
    f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    return jax.jit(f).lower(x).compile().as_text()


CASES = {  # per-device block [16] or [2, 4] float32; (kind, count, result bytes on one device) by hand
    "all-reduce": (lambda b: jax.lax.psum(b, "x"), (N * 16,), 16 * 4),
    "all-gather": (lambda b: jax.lax.all_gather(b, "x", tiled=True)[:2], (N * 2, 4), N * 2 * 4 * 4),
    "reduce-scatter": (lambda b: jnp.tile(jax.lax.psum_scatter(b, "x", tiled=True), N), (N * 16,), 2 * 4),
    "collective-permute": (lambda b: jax.lax.ppermute(b, "x", [(i, (i + 1) % N) for i in range(N)]),
                           (N * 16,), 16 * 4),
    "all-to-all": (lambda b: jax.lax.all_to_all(b, "x", 0, 0, tiled=True), (N * 16,), 16 * 4),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_one_collective_of_known_size(kind):
    body, shape, nbytes = CASES[kind]
    found = collectives(_compiled_text(body, jnp.ones(shape, jnp.float32)))
    assert found[kind] == {"count": 1, "bytes": nbytes}, found
    assert all(found[k]["count"] == 0 for k in KINDS if k != kind), found


def test_array_bytes_and_async_pairs():
    assert array_bytes("(f32[8,128]{1,0}, bf16[4], pred[], s8[3,3])") == [4096, 8, 1, 9]
    text = "\n".join([
        "  %ags = (f32[1,128]{1,0}, f32[8,128]{1,0}) all-gather-start(f32[1,128]{1,0} %p), dimensions={0}",
        "  %agd = f32[8,128]{1,0} all-gather-done((f32[1,128]{1,0}, f32[8,128]{1,0}) %ags)",
        "  %ar = (f32[4]{0}, bf16[2]{0}) all-reduce(f32[4]{0} %a, bf16[2]{0} %b), to_apply=%add",
        "  %add.1 = f32[4]{0} add(f32[4]{0} %x, f32[4]{0} %y)",
    ])
    found = collectives(text)
    assert found["all-gather"] == {"count": 1, "bytes": 8 * 128 * 4}  # the start's output, the done not again
    assert found["all-reduce"] == {"count": 1, "bytes": 16 + 4}  # a variadic all-reduce: both results
    with pytest.raises(ValueError, match="unknown HLO element type 'q7'"):
        array_bytes("q7[2]")


_WIDEN = """%wrapped_convert_computation.1 (param_0.1: bf16[2,8,16]) -> f32[2,8,16] {
  %param_0.1 = bf16[2,8,16]{2,1,0} parameter(0)
  ROOT %convert.1 = f32[2,8,16]{2,1,0} convert(%param_0.1)
}

%fused_scale (param_0.2: bf16[4,4]) -> f32[4,4] {
  %param_0.2 = bf16[4,4]{1,0} parameter(0)
  %convert.2 = f32[4,4]{1,0} convert(%param_0.2)
  ROOT %multiply.1 = f32[4,4]{1,0} multiply(%convert.2, %convert.2)
}

ENTRY %main (p: bf16[2,8,16], q: bf16[4,4]) -> f32[] {
  %wrapped_convert.1 = f32[2,8,16]{2,1,0} fusion(%p), kind=kLoop, calls=%wrapped_convert_computation.1
  %wrapped_convert.2 = f32[2,8,16]{2,1,0} fusion(%p), kind=kLoop, calls=%wrapped_convert_computation.1, x=1
  %fusion.3 = f32[4,4]{1,0} fusion(%q), kind=kLoop, calls=%fused_scale
}
"""


def test_upcasts_are_the_lone_bf16_to_f32_converts():
    """Only fusions that do nothing but widen a bf16 array count (each call once); a convert inside other work
    (the multiply) is not a copy."""
    assert upcast_bytes(_WIDEN) == 2 * (2 * 8 * 16 * 4)
    assert upcast_bytes(_WIDEN.replace("bf16[2,8,16]) ->", "f16[2,8,16]) ->")) == 0
