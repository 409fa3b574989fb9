"""PPO with a critic (`algorithm.name: ppo`, `jaxrl.rl.critic`): the value model reads the positions the
policy's log-probs read, the critic's value loss and GAE follow verl (tests/losses/test_gae.py has the goldens),
and through the real CLI a run with mini-batches, gradient accumulation and a critic warm-up resumes exactly,
critic included. The quickstart task learning with PPO: tests/train/test_quickstart.py."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from _common import metrics, run_train
from jaxrl import cli
from jaxrl.models import TransformerConfig
from jaxrl.reward_model.model import RewardModel
from jaxrl.rl.critic import token_values_BT

PPO = ("algorithm.name=ppo", "train.steps=4", "checkpoint.every=2", "algorithm.mini_batches=2",
       "algorithm.grad_accum=2", "algorithm.ppo.critic_warmup_steps=1", "algorithm.ppo.lam=0.95",
       "algorithm.ppo.gamma=0.99", "algorithm.ppo.value_clip=0.2", "algorithm.ppo.critic_lr=3e-3")


def test_values_are_the_value_head_on_each_completion_prefix():
    """V[b, t] is the value of the state before completion token t: the reward-model score (head on the last
    real token) of the row cut after position W − 1 + t, for left-padded prompts."""
    cfg = TransformerConfig.tiny(tie_embeddings=True, pad_token_id=0)
    # the initialisation jitted (one program instead of one per eager op) without LLVM optimisation (it runs
    # once); the graphdef from its shapes
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: RewardModel(cfg, rngs=nnx.Rngs(1))))
    state = jax.jit(lambda: nnx.split(RewardModel(cfg, rngs=nnx.Rngs(1)))[1],
                    compiler_options={"xla_backend_optimization_level": 0})()
    model = nnx.merge(graphdef, state)
    rng = np.random.default_rng(0)
    w, t = 5, 4
    tokens = rng.integers(1, cfg.vocab_size, (2, w + t)).astype(np.int32)
    tokens[1, :2] = 0  # the second prompt is left-padded
    mask = tokens != 0
    # the rows cut after position w - 1 + k, right-padded to one shape: [t, 2, L]
    prefixes = np.stack([np.where(np.arange(w + t)[None, :] < w + k, tokens, 0) for k in range(t)])

    @jax.jit  # the values and the scores of the t * 2 cut rows in one program
    def values_and_scores(tokens, mask, prefixes):
        rows = prefixes.reshape(-1, prefixes.shape[-1])
        return token_values_BT(model, tokens, mask, t), model(rows, rows != 0)[0].reshape(prefixes.shape[:2])

    values, scores = jax.device_get(values_and_scores(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(prefixes)))
    for k in range(t):
        np.testing.assert_allclose(values[:, k], scores[k], rtol=1e-5, atol=1e-6)


def _critic(run_dir, step: int) -> list[np.ndarray]:
    tree = ocp.StandardCheckpointer().restore((run_dir / "checkpoints" / str(step) / "critic").resolve())
    return jax.tree.leaves(tree)


@pytest.mark.slow  # two short CLI runs of the tiny model (~1 minute)
def test_ppo_trains_its_critic_and_resumes_exactly(tmp_path):
    """4 PPO steps (2 mini-batches x 2 micro-batches, γ = 0.99, λ = 0.95, value clip, 1 critic warm-up step);
    then the run cut back to its step-2 checkpoint and resumed: steps 3-4 and the critic's parameters and
    optimiser state at step 4 equal the uninterrupted run's."""
    full = tmp_path / "full"
    proc = run_train(full, *PPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in metrics(full) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # step 1: the critic's warm-up (no policy update), then both
    assert rows[0]["critic/warmup"] == 1 and "pg/loss" not in rows[0]
    assert all(r["critic/warmup"] == 0 and np.isfinite(r["pg/loss"]) for r in rows[1:])
    for r in rows:
        assert np.isfinite(r["critic/vf_loss"]) and r["critic/vf_loss"] > 0 and r["critic/grad_norm"] > 0
        assert 0 <= r["critic/vf_clip_frac"] <= 1 and r["train/nonfinite"] == 0
    # the critic moved: its values of the rollout change from step to step
    assert len({round(r["critic/values_mean"], 6) for r in rows}) == 4

    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "4")
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")  # rows of steps 0..2
    proc = run_train(cut, *PPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 2" in proc.stderr
    assert metrics(cut)[3:] == metrics(full)[3:]
    for a, b in zip(_critic(cut, 4), _critic(full, 4), strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_critic_init_exits_2_before_building(capsys, tmp_path):
    assert cli.main(["train", "--set", "algorithm.name=ppo", "--set", f"algorithm.ppo.critic_init={tmp_path}/none",
                     "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "algorithm.ppo.critic_init" in err and "no such directory" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # one short CLI run of the tiny model (~15 s)
def test_a_lora_critic_trains_adapters_over_the_policys_frozen_base(tmp_path):
    """`ppo.critic_lora` with a LoRA policy: the checkpoint's critic holds adapters and a head (no second
    trunk), its value loss trains (finite, the values move), and the policy's adapters train as usual."""
    run_dir = tmp_path / "lora"
    proc = run_train(run_dir, "algorithm.name=ppo", "train.steps=2", "model.lora={rank: 4, alpha: 8}",
                     "algorithm.ppo.critic_lora=true", "algorithm.ppo.critic_lr=3e-3", "checkpoint.every=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tree = ocp.StandardCheckpointer().restore((run_dir / "checkpoints" / "2" / "critic").resolve())
    assert set(tree["params"]) == {"adapters", "score"}
    assert set(tree["params"]["adapters"]["layers"]) <= {"self_attn", "mlp"}
    b = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree["params"]["adapters"])
         if "lora_b" in jax.tree_util.keystr(path)]
    assert b and any(np.abs(x).max() > 0 for x in b)  # B started at 0: the critic's adapters trained
    rows = [r for r in metrics(run_dir) if r["step"] > 0]
    assert all(np.isfinite(r["critic/vf_loss"]) and np.isfinite(r["pg/loss"]) for r in rows)
    assert rows[0]["critic/values_mean"] != rows[1]["critic/values_mean"]


def test_march_joint_batch_gae_follows_spec_1_10():
    """MARCH's faithful estimator (spec/multi-agent.md §1.7, worked numbers §1.10) through `ActorCritic`: a
    Solver row (score r_RM + r_fc = −0.2 at its last token, k1 KL [0.05, −0.02, 0.10, 0] in the reward with
    β = 0.1) and a Checker row (r_fc = −1 at L − 1, the `fixed` placement) in one batch, GAE γ = 0.998, λ = 1
    with the critic's values, whitened over the 7 trained tokens of both roles. The two rows are padded to
    the 4 rows of 4 mini-batches with rows that train on nothing; the actor is frozen during the critic's
    warm-up and gets the whitened advantages after it; the critic's batch holds the unwhitened returns."""
    from types import SimpleNamespace

    from jaxrl import losses
    from jaxrl.algorithms import AlgoSettings, KLRewardPenalty, estimators, segment_advantages
    from jaxrl.rl.critic import ActorCritic, CriticSpec
    from jaxrl.rl.run import UpdateSpec
    from jaxrl.rl.update import Updated
    from jaxrl.runtime import step_time
    from jaxrl.sharding import MeshConfig, make_mesh
    from jaxrl.sharding.rules import RULES

    t = 6
    cmask = np.zeros((2, t), bool)
    cmask[0, :4], cmask[1, :3] = True, True
    kl = np.array([[0.05, -0.02, 0.10, 0, 0, 0], [0] * t], np.float32)
    ref = np.full((2, t), -1.5, np.float32)
    ro = SimpleNamespace(tokens_BL=np.ones((2, 8), np.int32), mask_BL=np.ones((2, 8), bool), completion_mask_BT=cmask,
                         old_logp_BT=np.where(cmask, ref + kl, 0.0).astype(np.float32))
    values = np.array([[0.1, 0, -0.1, -0.2, 0, 0], [-0.5, -0.6, -0.7, 0, 0, 0]], np.float32)
    run = SimpleNamespace(mesh=make_mesh(MeshConfig(data=1, fsdp=1), jax.devices()[:1]), rules=RULES["fsdp"],
                          update=UpdateSpec(mini_batches=4), loss=SimpleNamespace(grad_accum=1),
                          policy=SimpleNamespace(reference="ref"),
                          logprob_fn=lambda params, tokens, mask, width: jnp.asarray(ref))
    settings = AlgoSettings(group_size=1, eps=1e-6, clip_low=0.2, clip_high=0.2, section=None)
    adv = segment_advantages(estimators.outcome_rewards, np.array([[-0.2], [-1.0]], np.float32),
                             np.ones(1, np.float32), cmask, settings, np.array([0, 1]), (1, 1))
    seen = {}

    def inner(run, state, params, ro, adv, records, step, clock, *, frozen):
        seen.update(adv=adv.adv_BT, frozen=frozen)
        return Updated(state, {"loss": 0.0}, 1)

    def step_fn(state, batch):
        seen.setdefault("batches", []).append(jax.device_get(batch))
        return state, {"critic/vf_loss": jnp.float32(0.0), "train/nonfinite": jnp.float32(0.0)}

    critic = SimpleNamespace(spec=CriticSpec(gamma=0.998, lam=1.0, whiten=True, warmup_steps=1), state=None,
                             step_fn=step_fn, values=lambda tokens, mask, width: jnp.asarray(values[[0, 1, 0, 0]]))
    schedule = ActorCritic(inner, critic, (KLRewardPenalty(run, 0.1, losses.KLKind.K1).token_rewards,))
    clock = step_time.StageClock()
    out = schedule(run, "state", None, ro, adv, [], 1, clock, frozen=False)
    assert seen["frozen"]  # step 1 <= critic_warmup_steps: the critic's step only
    assert out.metrics["kl"] == pytest.approx((0.05 - 0.02 + 0.10) / 2, abs=1e-6)
    schedule(run, "state", None, ro, adv, [], 2, clock, frozen=False)
    assert not seen["frozen"]
    np.testing.assert_allclose(seen["adv"][0, :4], [-0.3036, 0.3141, 0.8904, 1.5376], atol=1e-4)
    np.testing.assert_allclose(seen["adv"][1, :3], [-1.3916, -0.8128, -0.2341], atol=1e-4)
    assert seen["adv"].shape == (2, t) and not seen["adv"][~cmask].any()
    for batch in seen["batches"][-4:]:  # 4 mini-batches of one row each: the two real rows and two pads
        assert batch.returns_BT.shape == (1, t)
    rows = sorted((b for b in seen["batches"][-4:] if b.completion_mask_BT.any()),
                  key=lambda b: int(b.completion_mask_BT.sum()))
    assert len(rows) == 2
    np.testing.assert_allclose(rows[1].returns_BT[0, :4], [-0.211766, -0.207181, -0.209600, -0.2], atol=1e-6)
    np.testing.assert_allclose(rows[0].returns_BT[0, :3], np.array([-0.496004, -0.398, -0.3]) + values[1, :3],
                               atol=1e-6)
    np.testing.assert_array_equal(rows[1].old_values_BT[0], values[0])
