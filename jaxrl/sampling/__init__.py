"""jaxrl.sampling: the rollout engine (jitted prefill + KV-cached decode loop, group sampling).

Public API:
  generate(model, prompts, spec | **fields)                      -> Generation   (nnx.split, then the next)
  generate_from_state(graphdef, state, prompts, spec | **fields) -> Generation   (the trainer's form)
  SamplingSpec, Generation, pad_prompts, compile_count(), DEFAULT_PROMPT_BUCKETS, DEFAULT_GEN_BUCKETS
Multi-turn episodes: `multiturn.TurnDecoder` (lockstep turns), `episode_slots.SlotDecoder` (continuous slots).

Dimension letters: P prompts, G samples per prompt, B = P·G rows, L padded prompt width, T completion tokens,
V vocabulary, E stop tokens.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl.sampling.batching import (
    DEFAULT_GEN_BUCKETS,
    DEFAULT_PROMPT_BUCKETS,
    Generation,
    SamplingSpec,
    bucket,
    check_budgets,
    check_engine,
    check_prompts,
    check_settings,
    pad_prompts,
)
from jaxrl.sampling.continuous import continuous_for
from jaxrl.sampling.engine import compile_count, rollout_for
from jaxrl.sharding import hosts

__all__ = [
    "DEFAULT_GEN_BUCKETS",
    "DEFAULT_PROMPT_BUCKETS",
    "Generation",
    "SamplingSpec",
    "compile_count",
    "pad_prompts",
    "generate",
    "generate_from_state",
]


def generate(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    spec: SamplingSpec | None = None,
    *,
    eos_ids: Sequence[int] = (),
    seed: int | jax.Array = 0,
    pad_id: int = 0,
    batch_sharding: jax.sharding.Sharding | None = None,
    per_layer: bool | None = None,
    max_new_per_row: Sequence[int] | None = None,
    **spec_fields,
) -> Generation:
    """Samples completions from an NNX `Transformer`; see `generate_from_state`."""
    graphdef, state = nnx.split(model)
    return generate_from_state(graphdef, state, prompts, spec, eos_ids=eos_ids, seed=seed, pad_id=pad_id,
                               batch_sharding=batch_sharding, per_layer=per_layer,
                               max_new_per_row=max_new_per_row, **spec_fields)


def generate_from_state(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompts: Sequence[Sequence[int]],
    spec: SamplingSpec | None = None,
    *,
    eos_ids: Sequence[int] = (),
    seed: int | jax.Array = 0,
    pad_id: int = 0,
    batch_sharding: jax.sharding.Sharding | None = None,
    per_layer: bool | None = None,
    max_new_per_row: Sequence[int] | None = None,
    **spec_fields,
) -> Generation:
    """Samples completions with a KV cache: each prompt is prefilled once and shared by its G samples.

    Token choice follows HF `generate`: logits / τ, then top-k, then top-p (nucleus, arXiv:1904.09751);
    τ = 0 is greedy. Rows r = p·G + g; row r at decode step t draws with fold_in(fold_in(key(seed), t), r),
    so tokens do not depend on how rows are spread over devices. Returned logprobs are those of the tempered
    policy over the whole vocabulary, log softmax(z/τ) at the chosen token (no top-k / top-p;
    `jaxrl.sampling.filters.sampled_logprobs`), what the trainer recomputes.

    Args:
      graphdef, state: `nnx.split(model)` of a `jaxrl.models.Transformer`; state may already be sharded.
      prompts: P non-empty lists of token ids (different lengths allowed; they are left-padded).
      spec: the sampling settings (`SamplingSpec`); or give its fields as keywords instead
        (`max_new_tokens=8, num_samples=4, ...`). One compiled program per (P, G, prompt bucket, gen bucket,
        sampling mode).
      eos_ids: stop tokens; the EOS token is included in the completion and in `lengths`.
      seed: int or PRNG key.
      pad_id: token written after the end of each row (and used to pad prompts).
      batch_sharding: optional sharding of the [P, L] prompt arrays (e.g. rows over a data axis of a mesh).
      per_layer: decode on per-layer copies of the block weights and KV cache (`jaxrl.sampling.engine`):
        faster on CPU, where a layer scan copies every weight slice at every step, at the cost of one more
        copy of the block weights while sampling. None (default): True when the parameters are on CPU.
        Same tokens and logprobs either way (tested).
      max_new_per_row: optional [P·G] length budgets in [1, max_new_tokens]: row r stops after
        max_new_per_row[r] tokens (finished stays False unless it emitted an EOS). A workload with
        long-tailed lengths (`benchmarks/continuous.py`) is where `spec.engine = "continuous"` pays.

    Returns:
      Generation with tokens/logprobs [P·G, T], lengths/finished/prompt_index [P·G].
    """
    if spec is None:
        spec = SamplingSpec(**spec_fields)
    elif spec_fields:
        raise TypeError(f"pass either spec or its fields, not both (got {sorted(spec_fields)})")
    max_new_tokens, num_samples, temperature = spec.max_new_tokens, spec.num_samples, spec.temperature
    top_k, top_p = spec.top_k, spec.top_p
    cfg = _config_of(graphdef, state)
    vocab = int(cfg.vocab_size)
    prompt_ids = check_prompts(prompts, vocab)
    eos = check_settings(
        max_new_tokens=max_new_tokens, num_samples=num_samples, temperature=temperature, top_k=top_k,
        top_p=top_p, eos_ids=eos_ids, pad_id=pad_id, vocab_size=vocab,
    )
    longest = max(len(p) for p in prompt_ids)
    if longest + int(max_new_tokens) > cfg.max_position_embeddings:
        raise ValueError(
            f"longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_position_embeddings ({cfg.max_position_embeddings}) of the model"
        )
    gen_width = bucket(int(max_new_tokens), spec.gen_buckets, "completion")
    tokens_PL, mask_PL = pad_prompts(prompt_ids, spec.prompt_buckets, pad_id)
    if batch_sharding is not None:
        tokens_PL, mask_PL = jax.device_put((tokens_PL, mask_PL), batch_sharding)
    key = jax.random.key(int(seed)) if isinstance(seed, (int, np.integer)) else seed
    eos_E = np.asarray(eos or (-1,), np.int32)
    on_cpu = _on_cpu(state)
    per_layer = on_cpu if per_layer is None else bool(per_layer)
    rows = len(prompt_ids) * int(num_samples)
    shards = 1 if batch_sharding is None else hosts.row_blocks(batch_sharding, rows)
    slots = check_engine(spec.engine, spec.slots, rows, shards)
    budget_B = check_budgets(max_new_per_row, rows, max_new_tokens)
    if spec.engine == "continuous":
        run = functools.partial(continuous_for(on_cpu=on_cpu, per_layer=per_layer), slots=slots)
    else:
        run = rollout_for(on_cpu=on_cpu, per_layer=per_layer)
    tokens_BT, logp_BT, length_B, finished_B, steps = run(
        graphdef, state, tokens_PL, mask_PL, key,
        jnp.float32(temperature), jnp.float32(1.0 if top_p is None else top_p),
        jnp.int32(max_new_tokens), eos_E, jnp.int32(pad_id), budget_B,
        num_samples=int(num_samples), gen_width=gen_width, greedy=float(temperature) == 0.0,
        top_k=None if top_k is None else int(top_k), use_top_p=top_p is not None,
        per_layer=per_layer,
    )
    prompt_index = np.repeat(np.arange(len(prompt_ids), dtype=np.int32), int(num_samples))
    return Generation(
        tokens=tokens_BT[:, :max_new_tokens],
        lengths=length_B,
        logprobs=logp_BT[:, :max_new_tokens],
        finished=finished_B,
        prompt_index=jnp.asarray(prompt_index),
        decode_steps=steps,
    )


def _on_cpu(state: nnx.State) -> bool:
    """Whether the parameters live on CPU devices."""
    leaf = jax.tree.leaves(state)[0]
    devices = leaf.devices() if isinstance(leaf, jax.Array) else jax.devices()
    return all(d.platform == "cpu" for d in devices)


def _config_of(graphdef: nnx.GraphDef, state: nnx.State):
    """The `TransformerConfig` of a split model (merged abstractly; no arrays are copied)."""
    return nnx.merge(graphdef, state).cfg
