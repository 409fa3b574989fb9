"""Shared-prompt update (`TrainBatch.group`): train step, log-prob pass and trainer equal the unshared path.

Step level, in-process on one device: loss, metrics and gradients of `loss_and_grad` with `group = G` equal
`group = 1` on the same GRPO-shaped batch (fp32: loss rtol 1e-5; gradients atol 1e-6 of the leaf's largest
entry, rtol 1e-5, as tests/models/test_shared_prompt.py explains), for every aggregation mode, with KL,
entropy and SFT terms, gradient accumulation that keeps groups whole, LoRA adapters; `sequence_logprobs` too.
Trainer level: which batches share (`jaxrl.rl.batch.prompt_groups`), and that mini-batches hold whole groups.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests._xla import xla_flags

from jaxrl import losses
from jaxrl.rl import batch as rl_batch, run as rl_run
from jaxrl.errors import UserError
from jaxrl.models import Transformer, TransformerConfig, lora
from jaxrl.sharding import RULES, MeshConfig, make_mesh
from jaxrl.learner.train_step import LossSpec, TrainBatch, loss_and_grad, sequence_logprobs

P, G, W, T = 4, 3, 6, 5
B = P * G


def grouped_batch(seed=0, p=P, g=G, w=W, t=T, vocab=64, sft_rows=0) -> TrainBatch:
    """Prompt lengths w, 1, w//2 (cycled) left-padded, shared by the g rows of a group; completion lengths
    1..t (row 1 empty), random old / reference log-probs and advantages."""
    rng = np.random.default_rng(seed)
    b = p * g
    plen = np.repeat(np.resize(np.array([w, 1, w // 2]), p), g)
    pmask = np.arange(w)[None, :] >= w - plen[:, None]
    prompt = np.repeat(rng.integers(3, vocab, (p, w)), g, axis=0)
    clen = rng.integers(1, t + 1, b)
    clen[1] = 0
    cmask = np.arange(t)[None, :] < clen[:, None]
    comp = rng.integers(3, vocab, (b, t))
    tokens = np.concatenate([np.where(pmask, prompt, 0), np.where(cmask, comp, 0)], 1).astype(np.int32)
    old = np.where(cmask, -rng.uniform(1.0, 5.0, (b, t)), 0.0).astype(np.float32)
    ref = np.where(cmask, -rng.uniform(1.0, 5.0, (b, t)), 0.0).astype(np.float32)
    adv = np.where(cmask, rng.normal(size=(b, 1)), 0.0).astype(np.float32)
    sft = np.zeros(b, np.float32)
    sft[b - sft_rows:] = 1.0
    return TrainBatch(jnp.asarray(tokens), jnp.asarray(np.concatenate([pmask, cmask], 1)), jnp.asarray(cmask),
                      jnp.asarray(old), jnp.asarray(ref), jnp.asarray(adv), jnp.full((b,), 0.2, jnp.float32),
                      jnp.full((b,), 0.28, jnp.float32), jnp.asarray(sft))


@functools.lru_cache(maxsize=None)
def _model(norm="pre", qk_norm=False):
    cfg = TransformerConfig.tiny(norm=norm, qk_norm=qk_norm, family="qwen3" if qk_norm else "llama")
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    return graphdef, state.to_pure_dict()


def _run(params, graphdef, batch, spec, base=None):
    fn = jax.jit(functools.partial(loss_and_grad, graphdef=graphdef, spec=spec))
    return jax.device_get(fn(params, batch=batch, base=base))


def _run_specs(params, graphdef, batch, specs, base=None):
    """`_run` of each spec on the same batch, as one program: specs that differ in the loss only share the
    model's forward (one compile instead of one per spec, about a quarter of the time for four)."""
    fn = jax.jit(lambda params, batch, base: [loss_and_grad(params, graphdef, batch, s, base) for s in specs])
    return jax.device_get(fn(params, batch, base))


def _run_shared_and_unshared(params, graphdef, batch, spec, base=None):
    """(`_run` of the batch in groups of G, `_run` of it unshared), as one program: about 10-30% less
    compiling than two."""
    def both(params, batch, base):
        return [loss_and_grad(params, graphdef, b, spec, base) for b in (batch.replace(group=G), batch)]

    return jax.device_get(jax.jit(both)(params, batch, base))


def _assert_same(shared, unshared, label=""):
    """Loss, metrics and gradients of the shared step equal the unshared step's (`label` names the case)."""
    (loss, grads, metrics), (ref_loss, ref_grads, ref_metrics) = shared, unshared
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, err_msg=f"{label} loss")
    assert set(metrics) == set(ref_metrics), label
    for key in metrics:
        np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5, atol=1e-6, err_msg=f"{label} {key}")

    def close(path, got, want):
        scale = max(float(np.max(np.abs(want))), 1.0)
        np.testing.assert_allclose(got, want, atol=1e-6 * scale, rtol=1e-5,
                                   err_msg=f"{label} {jax.tree_util.keystr(path)}")

    jax.tree_util.tree_map_with_path(close, grads, ref_grads)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3, label


@functools.lru_cache(maxsize=None)
def _every_aggregation():
    """{agg: (shared, unshared) `loss_and_grad` outputs} on the GRPO-shaped batch with KL and entropy: every
    mode in one program per path, computed once for the four tests below."""
    graphdef, params = _model()
    batch = grouped_batch()
    aggs = list(losses.AggMode)
    specs = [LossSpec(agg=agg, kl_beta=0.05, entropy_coef=0.01) for agg in aggs]
    shared = _run_specs(params, graphdef, batch.replace(group=G), specs)
    return dict(zip(aggs, zip(shared, _run_specs(params, graphdef, batch, specs), strict=True), strict=True))


@pytest.mark.parametrize("agg", list(losses.AggMode))
def test_loss_and_gradients_equal_the_unshared_step(agg):
    _assert_same(*_every_aggregation()[agg], label=agg.value)


@pytest.mark.parametrize("norm, qk_norm", [("post", False), ("siamese_hybrid", True)])
def test_norm_variants_with_grad_accum_and_sft_rows(norm, qk_norm):
    """Two micro-batches of two whole groups each; the SFT term on the last group's rows (the step itself
    allows it; the trainer never shares prompts with appended expert rows)."""
    graphdef, params = _model(norm, qk_norm)
    batch = grouped_batch(seed=1, sft_rows=G)
    spec = LossSpec(grad_accum=2, sft_lambda=0.5, dual_clip=3.0)
    _assert_same(*_run_shared_and_unshared(params, graphdef, batch, spec))


def test_lora_adapters_over_a_frozen_base():
    graphdef, params = _model()
    lcfg = lora.LoraConfig(rank=2, alpha=4.0)
    adapters = lora.init_adapters(params, lcfg, jax.random.key(1))
    adapters = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(2), x.shape), adapters)
    batch, spec = grouped_batch(seed=2), LossSpec(lora=lcfg)
    _assert_same(*_run_shared_and_unshared(adapters, graphdef, batch, spec, base=params))


def test_sequence_logprobs_and_micro_batches_that_split_groups():
    graphdef, params = _model()
    batch = grouped_batch(seed=3)

    def shared_and_unshared(params, tokens_BL, mask_BL):  # one program (eager dispatch cost more)
        fn = functools.partial(sequence_logprobs, params, graphdef, tokens_BL, mask_BL, T, chunk=8192)
        return fn(group=G), fn()

    shared, unshared = jax.jit(shared_and_unshared)(params, batch.tokens_BL, batch.mask_BL)
    m = np.asarray(batch.completion_mask_BT)
    np.testing.assert_allclose(np.asarray(shared)[m], np.asarray(unshared)[m], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="split the prompt groups"):
        _run(params, graphdef, batch.replace(group=G), LossSpec(grad_accum=3))  # 4-row micro-batches


def _fake_run(share="auto", group_size=G, mini_batches=1, grad_accum=1):
    """The `Run` fields `prompt_groups`, `update` and `shard_batch` read, on a one-device mesh."""
    mesh = make_mesh(MeshConfig(data=1, fsdp=1), devices=jax.devices()[:1])
    return types.SimpleNamespace(
        share_prompts=share, settings=types.SimpleNamespace(group_size=group_size), mesh=mesh,
        rules=RULES["fsdp"], update=rl_run.UpdateSpec(ppo_epochs=2, mini_batches=mini_batches, seed=0),
        loss=LossSpec(grad_accum=grad_accum), packer=None)


def _with(ns, **changes):
    return types.SimpleNamespace(**{**vars(ns), **changes})


def _rollout(batch: TrainBatch, segment_B=None):
    return types.SimpleNamespace(tokens_BL=batch.tokens_BL, mask_BL=np.asarray(batch.mask_BL),
                                 completion_mask_BT=np.asarray(batch.completion_mask_BT), prompt_width=W,
                                 segment_B=segment_B)


def test_which_batches_share_prompts():
    batch = grouped_batch()
    ro = _rollout(batch)
    assert rl_batch.prompt_groups(_fake_run(), ro) == (G, "")
    assert rl_batch.prompt_groups(_fake_run(mini_batches=2, grad_accum=2), ro) == (G, "")  # 3 rows per micro
    host = _rollout(jax.device_get(batch))  # host token arrays are checked on the host
    assert rl_batch.prompt_groups(_fake_run(), host) == (G, "")
    cases = {
        "never": (_fake_run("never"), ro, {}),
        "groups of 1": (_fake_run(group_size=1), ro, {}),
        "role segments": (_fake_run(), _rollout(batch, np.zeros(B, np.int32)), {}),
        "extra rows": (_fake_run(), ro, {"extra_rows": True}),
        "no prompt columns": (_fake_run(), _with(ro, prompt_width=0), {}),
        "do not split": (_fake_run(mini_batches=4, grad_accum=2), ro, {}),
        "differ in their prompt": (_fake_run(), _rollout(batch.replace(tokens_BL=batch.tokens_BL.at[1, -T - 1]
                                                                       .add(1))), {}),
    }
    for why, (run, rollout, kw) in cases.items():
        group, reason = rl_batch.prompt_groups(run, rollout, **kw)
        assert group == 1 and why in reason, (why, reason)
        if why != "never":
            with pytest.raises(UserError, match="cannot share prompts"):
                rl_batch.prompt_groups(_with(run, share_prompts="always"), rollout, **kw)
    other_mask = np.asarray(batch.mask_BL).copy()
    other_mask[G, 0] = ~other_mask[G, 0]  # a padding difference inside group 1
    assert rl_batch.prompt_groups(_fake_run(), _with(ro, mask_BL=other_mask))[0] == 1


def test_padding_rows_keep_the_static_group_field():
    """`pad_rows` pads the arrays of a batch (expert rows) and leaves `group` alone (it once tried to pad it:
    the multi-host SFT-aux run, where the rows did not divide the shards)."""
    extra = jax.device_get(grouped_batch(seed=6, p=1, g=3))
    padded = rl_batch.pad_rows(extra, 2, 4)  # 2 rollout + 3 extra rows -> 3 padding rows
    assert padded.tokens_BL.shape[0] == 6 and padded.group == 1
    assert not padded.completion_mask_BT[3:].any() and not padded.sft_weight_B[3:].any()


@pytest.mark.parametrize("group", [1, G])
def test_mini_batches_hold_whole_groups(group):
    """Row r's tokens carry r, so each mini-batch the step sees names its rows. With groups, every mini-batch
    is whole groups (consecutive, in order inside a group) and each epoch covers every row once; without,
    rows are shuffled as before (`rng.permutation(n)` of the step-seeded RNG)."""
    batch = grouped_batch(seed=4)
    batch = batch.replace(tokens_BL=batch.tokens_BL.at[:, 0].set(jnp.arange(B)), group=group)
    seen = []

    def step_fn(state, mb):
        seen.append(np.asarray(mb.tokens_BL[:, 0]))
        assert mb.group == group
        return state, {"loss": jnp.zeros(()), "train/nonfinite": jnp.zeros((), jnp.int32)}

    run = _with(_fake_run(mini_batches=2), step_fn=step_fn)
    rl_batch.update(run, None, batch, step=7)
    assert len(seen) == 4 and all(len(rows) == B // 2 for rows in seen)
    for epoch in (seen[:2], seen[2:]):
        assert sorted(np.concatenate(epoch)) == list(range(B))
    if group == 1:
        rng = np.random.default_rng([0, 7])
        np.testing.assert_array_equal(np.concatenate(seen[:2]), rng.permutation(B))
    else:
        for rows in seen:
            groups = rows.reshape(-1, G)
            np.testing.assert_array_equal(groups, groups[:, :1] + np.arange(G))
            assert (groups[:, 0] % G == 0).all()


_SHARDED_G, _SHARDED_SPEC = 2, LossSpec(kl_beta=0.05, entropy_coef=0.01, grad_accum=2)


def _sharded_setup():
    """The sharded cases' batch (16 groups of 2), model config and optimiser."""
    import optax

    batch = grouped_batch(seed=5, p=16, g=_SHARDED_G)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-4))
    return batch, TransformerConfig.tiny(num_kv_heads=4), tx


@functools.lru_cache(maxsize=None)
def _single_device_unshared_reference():
    """(loss, gradients, metrics) and the updated params of the unshared step on one device: the same for
    both meshes, so compiled and computed once."""
    from jaxrl.learner.train_step import TrainState

    batch, cfg, tx = _sharded_setup()
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    params = state.to_pure_dict()
    ref, (ref_state, _) = jax.jit(_step_and_loss_and_grad(graphdef, tx))(
        TrainState(params, tx.init(params), jnp.zeros((), jnp.int32)), batch)
    return jax.device_get(ref), jax.device_get(ref_state.params)


def _step_and_loss_and_grad(graphdef, tx):
    """(state, batch) -> (`loss_and_grad`, `train_step`) of the sharded cases' spec, for one program: the
    step's own loss and gradients are the same computation, so the pair compiles about as one step."""
    from jaxrl.learner.train_step import train_step

    def both(state, batch):
        step = train_step(state, batch, graphdef=graphdef, spec=_SHARDED_SPEC, tx=tx)
        return loss_and_grad(state.params, graphdef, batch, _SHARDED_SPEC), step

    return both


@pytest.mark.slow  # a sharded compile of the RL step per mesh (the single-device reference compiles once)
@pytest.mark.parametrize("mesh_cfg, rules", [(MeshConfig(data=2, fsdp=4), "fsdp"),
                                             (MeshConfig(fsdp=2, tensor=4, rules="fsdp_tp"), "fsdp_tp")])
def test_sharded_shared_step_equals_the_single_device_unshared_step(mesh_cfg, rules):
    """Rows over the batch shards, two micro-batches of 8 groups of 2 (one group per shard of data x fsdp),
    activation constraints on the grouped [P, W + G·T] layout: the same loss, gradients and update."""
    from jaxrl.sharding import batch_shardings, make_constrain, state_shardings
    from jaxrl.learner.train_step import TrainState

    g = _SHARDED_G
    batch, cfg, tx = _sharded_setup()
    ref, ref_params = _single_device_unshared_reference()

    mesh, rules = make_mesh(mesh_cfg), RULES[rules]
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0), constrain=make_constrain(mesh, rules)))
    param_sh = state_shardings(state, mesh, rules).to_pure_dict()
    params = jax.device_put(state.to_pure_dict(), param_sh)
    opt_state = tx.init(params)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state_sh = TrainState(param_sh, state_shardings(opt_state, mesh, rules, params=state), rep)
    shared = batch.replace(group=g)
    shared = jax.device_put(shared, batch_shardings(shared, mesh, rules))
    step = jax.jit(_step_and_loss_and_grad(graphdef, tx), in_shardings=(state_sh, None),
                   out_shardings=(None, (state_sh, None)), donate_argnums=0)
    train_state = jax.device_put(TrainState(params, opt_state, jnp.zeros((), jnp.int32)), state_sh)
    got, (new_state, _) = step(train_state, shared)
    _assert_same(jax.device_get(got), ref)
    for p, r in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(ref_params), strict=True):
        np.testing.assert_allclose(np.asarray(p), np.asarray(r), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # two one-step CLI trainings
def test_cli_step_equals_the_unshared_step(tmp_path):
    """One GRPO step through the CLI (old and reference log-probs recomputed by the trainer, KL in the loss,
    two micro-batches) with `train.share_prompts` auto and never: the same rollout, so every metric agrees
    (the loss terms to fp32 rounding); `train/shared_prompts` says which path ran."""
    from _common import metrics, run_train

    sets = ("train.steps=1", "algorithm.kl.beta=0.1", "algorithm.grad_accum=2")
    rows = {}
    for share in ("auto", "never"):
        proc = run_train(tmp_path / share, *sets, f"train.share_prompts={share}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        (rows[share],) = metrics(tmp_path / share)
    shared, unshared = rows["auto"], rows["never"]
    assert shared.pop("train/shared_prompts") == 1.0 and unshared.pop("train/shared_prompts") == 0.0
    assert set(shared) == set(unshared)
    for key, value in unshared.items():
        np.testing.assert_allclose(shared[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert "kl/loss" in shared and shared["loss"] != 0  # (the KL itself is 0 at step 1: policy = reference)
    assert shared["mismatch/abs_logp_diff_mean"] < 1e-3  # the shared log-prob pass agrees with the sampler


_GROUPED_UPDATE = """
import sys
from pathlib import Path
import numpy as np
from jaxrl.rl import batch as rl_batch, setup as rl_setup
from jaxrl.config import load_config
from jaxrl.learner.train_step import TrainBatch

W, T, B, G = 128, 128, 64, 8  # configs/search_tiny.yaml's step: 8 prompts x 8 episodes, 128-token buckets
run, state, _ = rl_setup.setup(load_config("configs/search_tiny.yaml", ["sft_warmup.steps=0"]), Path(sys.argv[1]))
rng = np.random.default_rng(0)
tokens = rng.integers(3, 100, (B, W + T)).astype(np.int32)
tokens[:, :W] = np.repeat(tokens[::G, :W], G, axis=0)
mask = np.ones((B, W + T), bool)
mask[:, : W // 2] = False
mask[:, W + T // 2:] = False
completion = np.zeros((B, T), bool)
completion[:, : T // 3] = True
f32 = lambda *shape, v=0.0: np.full(shape, v, np.float32)
batch = TrainBatch(tokens, mask, completion, f32(B, T, v=-1.0), f32(B, T), rng.normal(size=(B, T)).astype(np.float32),
                   f32(B, v=0.2), f32(B, v=0.28), f32(B), None, G)
old = run.logprob_fn(state.params, tokens, mask, T, G)
state, metrics = rl_batch.update(run, state, rl_batch.shard_batch(run, batch), 1)
print("loss", metrics["loss"], "old", float(np.asarray(old).mean()))
"""


@pytest.mark.slow  # a CPU compile of the tiny config's grouped update, in a subprocess
def test_grouped_update_of_the_search_tiny_step_runs_on_cpu(tmp_path):
    """The trainer's compile of a shared-prompt update and log-prob pass at configs/search_tiny.yaml's shapes
    finishes with a finite loss. With YNNPACK's dot fusion jaxlib 0.10.2's XLA:CPU segfaulted here (CI: the
    search_tiny test died at its first RL step) when the gradient of the attention's prompt / completion
    concatenation compiled to a fusion that pads a dot and reuses it; the trainer compiles with YNNPACK only
    where no fusion does (`jaxrl.learner.cpu_compile.cpu_jit`); a subprocess, so a crash fails this test
    instead of killing the session."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", XLA_FLAGS=xla_flags())
    proc = subprocess.run([sys.executable, "-c", _GROUPED_UPDATE, str(tmp_path / "run")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    loss, old = (float(x) for x in proc.stdout.split()[1::2])
    assert np.isfinite(loss) and loss != 0 and np.isfinite(old) and old < 0, proc.stdout
