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
    model = RewardModel(cfg, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    w, t = 5, 4
    tokens = rng.integers(1, cfg.vocab_size, (2, w + t)).astype(np.int32)
    tokens[1, :2] = 0  # the second prompt is left-padded
    mask = tokens != 0
    values = np.asarray(token_values_BT(model, jnp.asarray(tokens), jnp.asarray(mask), t))
    score = jax.jit(lambda x: model(x, x != 0)[0])
    for k in range(t):  # the rows cut after position w - 1 + k, right-padded to one shape
        prefix = np.where(np.arange(w + t)[None, :] < w + k, tokens, 0)
        np.testing.assert_allclose(values[:, k], np.asarray(score(jnp.asarray(prefix))), rtol=1e-5, atol=1e-6)


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
                     "algorithm.ppo.critic_lora=true", "algorithm.ppo.critic_lr=3e-3")
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
