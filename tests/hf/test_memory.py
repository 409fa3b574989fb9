"""Streaming import: a Qwen3-0.6B-shaped checkpoint loads with peak host memory under ~2x its size."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from jaxrl.models import TransformerConfig

_CHILD = """
import resource, sys
from jaxrl.io import hf
model = hf.from_pretrained(sys.argv[1], dtype="bfloat16")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
_BASELINE = """
import resource
import jax, jax.numpy as jnp, flax, numpy, safetensors, orbax.checkpoint
from jaxrl.io import hf
jnp.zeros(3).block_until_ready()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""



@pytest.mark.slow
def test_qwen3_0_6b_import_peak_rss(tmp_path):
    from safetensors.numpy import save_file

    from jaxrl.io.hf import hf_config_dict
    from jaxrl.models import hf_io

    cfg = TransformerConfig.qwen3_0_6b().replace(param_dtype="bfloat16", dtype="bfloat16")
    shapes = hf_io.hf_shapes(cfg)
    # The values do not matter to the peak RSS, only the bytes: each tensor repeats one random block (drawing
    # 0.6 B normals took ~12 s of CPU, most of this test's time).
    block = (0.02 * np.random.default_rng(0).standard_normal(1_000_003, np.float32)).astype(ml_dtypes.bfloat16)
    names = sorted(shapes)
    half = len(names) // 2
    weight_map, total = {}, 0
    for i, group in enumerate((names[:half], names[half:])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        tensors = {n: np.resize(block, shapes[n]) for n in group}
        save_file(tensors, str(tmp_path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
        total += sum(t.nbytes for t in tensors.values())
        del tensors
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(cfg)))

    def run(code, *args):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    baseline = run(_BASELINE)
    peak = run(_CHILD, str(tmp_path))
    increase = peak - baseline
    print(f"\ncheckpoint {total / 2**30:.2f} GiB, baseline RSS {baseline / 2**30:.2f} GiB, "
          f"peak RSS {peak / 2**30:.2f} GiB, increase {increase / 2**30:.2f} GiB = {increase / total:.2f}x")
    assert total > 1.0e9  # 0.6 B params in bf16 (~1.2 GB incl. tied embedding once)
    assert increase < 2.0 * total
