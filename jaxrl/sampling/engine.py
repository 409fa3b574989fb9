"""The compiled rollout: prefill each prompt once, share its KV cache with G samples, decode in a while_loop.

    cache, z_P = prefill(prompts_PL)                       # one forward over the left-padded prompts
    cache, z_B = cache.repeat(G), repeat(z_P, G)           # B = P·G rows, rows of one prompt contiguous
    for t < max_new_tokens while some row is unfinished:   # lax.while_loop
        y_B  ~ filter(z_B / τ)   (argmax when τ = 0)
        ℓ_B  = log_softmax(z_B / τ)[y_B]                   # tempered, unfiltered: see below
        z_B, cache = forward(y_B, position = len_B + t, cache)

Everything above is one `jax.jit` of a pure function of `(graphdef, state, arrays)`; shapes are the static
bucketed widths, while temperature, top-p and max_new_tokens are traced values (changing them never
recompiles).

Notes:
* Logprobs are those of the tempered policy over the whole vocabulary, log softmax(z/τ) at the sampled
  token (`filters.sampled_logprobs`, τ = 1 when greedy): top-k / top-p are not applied, as in TRL and verl.
  The trainer recomputes the same (`LossSpec.temperature` = `rollout.temperature`), so the ratio π_θ/π_old
  is exactly 1 before the first update at any τ, with or without filtering.
* Prefill computes logits only for the last prompt column (`hidden[:, -1] @ unembedding`) instead of
  [P, L, V]; left padding makes that column the last real token of every row.
* The final decode step runs one forward whose logits are never used (it keeps the loop body branch-free).
* `per_layer=True` (the default on CPU, see `generate`): before the loop the stacked block weights are split
  into per-layer buffers (`Transformer.layer_states`, one extra copy of the weights while sampling) and the
  cache into per-layer buffers (`KVCache.unstack`); the decode step then runs the layers unrolled and reads
  every weight in place. A layer scan instead copies each weight slice out of its stack at every step on
  XLA:CPU. Accelerators keep the scan (`per_layer=False`), where a stack slice is not a copy. On CPU the
  per-layer program is compiled with region-based copy insertion (`rollout_for`): without it XLA copies
  every layer's whole cache buffer at every step, since the attention reads the buffer the step then
  writes in place.
* Shardings: the state keeps its own (FSDP) shardings; with a `constrain` callback
  (`jaxrl.sharding.make_constrain(mesh, rules)`) the prompts, the KV cache and every output are pinned to
  the batch layout (rows over `data` x `fsdp`, the longest prefix that divides the row count), so a host of
  a multi-host job knows which rows of `tokens_BT` it holds (`jaxrl.sharding.hosts`) instead of inheriting
  whatever layout the partitioner picked.
* `compile_count()` counts traces of the compiled function: the only mutable module state here.
"""

from __future__ import annotations


import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl.models import KVCache
from jaxrl.runtime import compile_cache
from jaxrl.sampling import filters
from jaxrl.sharding import KV_CACHE_NAMES, Constrain

# Sharded XLA:CPU decode loops stay out of the persistent compilation cache (`jaxrl.runtime.compile_cache`).
compile_cache.install()

_trace_count = 0


def compile_count() -> int:
    """Number of times the rollout function has been traced (≈ compiled) in this process."""
    return _trace_count


def _last_logits(model, hidden_BD: jax.Array) -> jax.Array:
    """[B, V] float32 logits of the final hidden states [B, D]."""
    w_DV = model.unembedding()
    return jnp.einsum("BD,DV->BV", hidden_BD, w_DV, preferred_element_type=jnp.float32)


def start(graphdef, state, tokens_PL, mask_PL, scalars, eos_E, budget_B, num_samples: int,
          constrain: Constrain | None):
    """(model, pin, tokens_PL, mask_PL) at the top of a rollout program (both engines): the arguments
    checked, the model merged, the prompts pinned to the batch layout (`pin` is the identity without
    `constrain`)."""
    chex.assert_rank([tokens_PL, mask_PL], 2)
    chex.assert_equal_shape([tokens_PL, mask_PL])
    chex.assert_rank(list(scalars), 0)
    chex.assert_shape([eos_E, budget_B], [(None,), (tokens_PL.shape[0] * num_samples,)])
    pin = constrain or (lambda x, names: x)
    tokens_PL, mask_PL = pin(tokens_PL, ("batch", "length")), pin(mask_PL, ("batch", "length"))
    return nnx.merge(graphdef, state), pin, tokens_PL, mask_PL


def prefill(model, tokens_PL: jax.Array, mask_PL: jax.Array, gen_width: int):
    """(KV cache of the P prompts with room for `gen_width` more slots, last-column logits [P, V]): one
    forward over the left-padded prompts, logits only for the last column (the last real token of each row).

    The barrier keeps XLA from constant-folding the prefill's (all-masked) scores over the empty cache.
    """
    num_prompts, width = tokens_PL.shape
    cache = KVCache.init(model.cfg, num_prompts, width + gen_width, model.cfg.dtype)
    cache = jax.lax.optimization_barrier(cache)
    positions_PL = jnp.maximum(jnp.cumsum(mask_PL.astype(jnp.int32), axis=-1) - 1, 0)
    out = model.forward(
        tokens_PL, positions_PL, mask_PL, cache=cache, return_hidden=True, return_logits=False
    )
    return out.cache, _last_logits(model, out.hidden[:, -1])


def is_eos(tok_B: jax.Array, eos_E: jax.Array) -> jax.Array:
    """[B] bool: the token is one of the stop tokens eos_E ([E] int32, -1 entries match nothing)."""
    return jnp.any(tok_B[:, None] == eos_E[None, :], axis=-1)


def finished_rows(tokens_BT: jax.Array, length_B: jax.Array, eos_E: jax.Array) -> jax.Array:
    """[B] bool: the row's last token is a stop token (an EOS ends a row, so it is only ever the last)."""
    last_B = jnp.take_along_axis(tokens_BT, jnp.maximum(length_B - 1, 0)[:, None], axis=-1)[:, 0]
    return (length_B > 0) & is_eos(last_B, eos_E)


def _rollout(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    tokens_PL: jax.Array,
    mask_PL: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    max_new_tokens: jax.Array,
    eos_E: jax.Array,
    pad_id: jax.Array,
    budget_B: jax.Array,
    *,
    num_samples: int,
    gen_width: int,
    greedy: bool,
    top_k: int | None,
    use_top_p: bool,
    per_layer: bool = False,
    constrain: Constrain | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Prefill + decode loop. Returns (tokens_BT, logprobs_BT, lengths_B, finished_B, decode steps) with
    T = gen_width.

    Args:
      graphdef, state: `nnx.split(model)`; state may be sharded.
      tokens_PL, mask_PL: [P, L] left-padded int32 prompts and bool mask (True = real token).
      key: PRNG key; row r at step t draws from fold_in(fold_in(key, t), r).
      temperature, top_p: float32 scalars (top_p ignored unless `use_top_p`).
      max_new_tokens: int32 scalar <= gen_width.
      eos_E: [E] int32 stop tokens (-1 entries never match).
      pad_id: int32 scalar written after the end of each row.
      budget_B: [B] int32, row b stops after budget_B[b] tokens (its own length budget; >= max_new_tokens
        for none). The static batch keeps a stopped row's slot until the loop ends.
      num_samples: G; gen_width: decode buffer width; greedy/top_k/use_top_p: static sampling mode.
      per_layer: decode on per-layer weight and cache buffers (see the module notes).
      constrain: optional sharding callback (module notes): pins prompts, KV cache and outputs to the batch
        layout. None leaves the layouts to the partitioner.
    """
    global _trace_count
    _trace_count += 1
    model, pin, tokens_PL, mask_PL = start(graphdef, state, tokens_PL, mask_PL, (temperature, top_p, max_new_tokens,
                                                                                 pad_id), eos_E, budget_B,
                                           num_samples, constrain)
    rows = tokens_PL.shape[0] * num_samples

    # Prefill the P prompts once; the G samples of a prompt share its cache.
    cache_P, logits_PV = prefill(model, tokens_PL, mask_PL, gen_width)
    logits_BV = jnp.repeat(logits_PV, num_samples, axis=0)
    cache = pin_cache(cache_P.repeat(num_samples), pin)
    layers = None
    if per_layer:
        layers, cache = model.layer_states(), cache.unstack()
    next_pos_B = jnp.repeat(jnp.sum(mask_PL, axis=-1, dtype=jnp.int32), num_samples)
    rows_B = jnp.arange(rows, dtype=jnp.int32)
    top_p_arg = top_p if use_top_p else None

    def cond(carry):
        t, _, _, _, _, done_B, _ = carry
        return (t < max_new_tokens) & ~jnp.all(done_B)

    def body(carry):
        t, logits_BV, cache, tokens_BT, logp_BT, done_B, length_B = carry
        active_B = ~done_B
        tok_B, tokens_BT, logp_BT, length_B = filters.emit_tokens(
            logits_BV, key, t, rows_B, active_B, tokens_BT, logp_BT, length_B, temperature=temperature,
            greedy=greedy, top_k=top_k, top_p=top_p_arg, pad_id=pad_id)
        stop_B = is_eos(tok_B, eos_E) | (length_B >= budget_B)
        done_B = done_B | (active_B & stop_B)
        step = model.forward(
            tok_B[:, None], (next_pos_B + t)[:, None], jnp.ones((rows, 1), bool), cache=cache, layers=layers
        )
        return t + 1, step.logits[:, -1].astype(jnp.float32), step.cache, tokens_BT, logp_BT, done_B, length_B

    init = (
        jnp.int32(0),
        logits_BV,
        cache,
        jnp.full((rows, gen_width), pad_id, jnp.int32),
        jnp.zeros((rows, gen_width), jnp.float32),
        jnp.zeros((rows,), bool),
        jnp.zeros((rows,), jnp.int32),
    )
    steps, _, _, tokens_BT, logp_BT, _, length_B = jax.lax.while_loop(cond, body, init)
    rows_BT, rows_B = ("batch", None), ("batch",)
    finished_B = finished_rows(tokens_BT, length_B, eos_E)
    return (pin(tokens_BT, rows_BT), pin(logp_BT, rows_BT), pin(length_B, rows_B), pin(finished_B, rows_B),
            steps)


def pin_cache(cache: KVCache, pin) -> KVCache:
    """The stacked KV cache with each field pinned to its logical names (`KV_CACHE_NAMES`)."""
    if isinstance(cache.k, (tuple, list)):  # per-layer form: pinned after `unstack` by the decode step
        return cache
    return jax.tree_util.tree_map_with_path(
        lambda path, x: pin(x, KV_CACHE_NAMES[str(getattr(path[-1], "name", path[-1]))]), cache)


_STATIC = ("graphdef", "num_samples", "gen_width", "greedy", "top_k", "use_top_p", "per_layer", "constrain")
# XLA:CPU options of the decode programs (benchmarks/RESULTS.md, "CPU decode"):
# * YNNPACK library fusions off: XLA:CPU hands each decode-step dot to YNNPACK, whose MLP down projection of a
#   few rows ([B, 384] x [384, 128] on the 4-layer test model) took 23 ms a call inside the decode loop, where
#   XLA's own dot takes well under 1 ms; a 56-token rollout of 128 rows 5.7 -> 1.1 s, a tiny-model RL step
#   7.3 -> 1.9 s of generation (2-core AMD EPYC); SmolLM2-135M's shape at 16 rows 5.0 -> 4.5 s, at 64 rows
#   the same. Training programs keep YNNPACK dot fusions (`train_step.update_compiler_options`).
# * Region-based copy insertion (per-layer programs): per-layer decode step 37 -> 33 ms for SmolLM2 at B=16 on
#   a 2-core CPU (no more per-step copies of the per-layer cache buffers). It made the layer scan no faster.
CPU_DECODE_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
CPU_PER_LAYER_OPTIONS = {**CPU_DECODE_OPTIONS, "xla_cpu_copy_insertion_use_region_analysis": True}


class Programs:
    """A rollout function jitted for each platform form; `programs(on_cpu=, per_layer=)` is the one to call
    (CPU programs have their own compiler options, above). Both engines have one (`rollout_for` here,
    `jaxrl.sampling.continuous.continuous_for`); `donate_argnames`: inputs whose buffers the program reuses."""

    def __init__(self, fn, static_argnames, donate_argnames=()):
        jit = lambda **kw: jax.jit(fn, static_argnames=static_argnames, donate_argnames=donate_argnames, **kw)
        self.accelerator = jit()
        self.cpu = jit(compiler_options=CPU_DECODE_OPTIONS)
        self.cpu_per_layer = jit(compiler_options=CPU_PER_LAYER_OPTIONS)

    def __call__(self, *, on_cpu: bool, per_layer: bool):
        if not on_cpu:
            return self.accelerator
        return self.cpu_per_layer if per_layer else self.cpu


rollout_for = Programs(_rollout, _STATIC)
rollout = rollout_for.accelerator
