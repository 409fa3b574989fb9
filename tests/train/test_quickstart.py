"""The embedded default (configs/quickstart.yaml), shortened: RL raises held-out accuracy after warm-up.

Runs `jaxrl train` with no config file (the embedded default) in a subprocess on one CPU device, with its full
SFT warm start and 20 instead of 80 RL steps. The warm start's demonstrations use the required `<answer>` tags
only one time in four, so greedy held-out answers start mostly untagged (the strict answer reward scores them
0); RL must make the tagged answer the policy's choice. Fixed seeds make the run deterministic; the assertions
are on the learning effect (held-out format and accuracy after RL well above the warm start, training reward
rising), not on exact values. The run's last checkpoint is then the teacher of an on-policy distillation run
that starts from the run's warm start, kept as its step-0 checkpoint (one module fixture, so the file's tests
share the run, and the student does not repeat the 700 warm-start steps), and of a PPO run with a critic from
the same warm start.
"""

import subprocess
import sys

import pytest

from _common import ROOT, env, metrics

SHORT = ("train.steps=20", "train.eval_every=20", "logging.progress_bar=false",
         "logging.tensorboard=false", "checkpoint.every=1000", "checkpoint.async_save=false")
# Distillation alone: the task rewards weigh nothing, so the teacher is the only signal.
NO_TASK_REWARD = ("rewards=[{name: answer, type: math_answer, weight: 0.0, params: {tags_only: true}},"
                  " {name: format, type: format, weight: 0.0, params: {tags: [answer]}}]")
DISTILL_STEPS = 6


def _train(run_dir, *overrides: str) -> list[dict]:
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", *[a for o in overrides for a in ("--set", o)],
           "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(fast_compile=False), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return metrics(run_dir)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """(run directory, metrics rows) of the shortened quickstart; its last checkpoint is the distillation
    test's teacher."""
    run_dir = tmp_path_factory.mktemp("quickstart") / "qs"
    return run_dir, _train(run_dir, *SHORT)


@pytest.mark.slow  # ~3 minutes on 2 cores (700 SFT steps + 20 RL steps of the 4-layer model)
def test_quickstart_held_out_accuracy_rises(quickstart):
    _, rows = quickstart
    evals = {r["step"]: r for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [0, 20]
    before, after = evals[0], evals[20]
    assert before["eval/reward/format/mean"] < 0.5 < 0.9 < after["eval/reward/format/mean"]
    assert after["eval/accuracy"] > before["eval/accuracy"] + 0.15
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    assert mean(train[-5:], "reward/mean") > mean(train[:5], "reward/mean") + 0.1


@pytest.mark.slow  # ~1 minute: 6 distillation steps from the teacher run's step-0 checkpoint
def test_on_policy_distillation_alone_teaches_the_quickstart_task(quickstart, tmp_path):
    """Issue 28 item 3: the quickstart run above (RL on the task rewards) is the teacher; a student from the
    same warm start (the teacher run's step-0 checkpoint: the warm-started model, kept for good) trains with
    every task reward at weight 0, so only the teacher's per-token reverse KL
    (`algorithm.distill`, mode reward) moves it. Held-out format and accuracy rise from the warm start's
    towards the teacher's, and the reverse KL to the teacher falls. (Faster than RL alone, with seeds and
    spread: `experiments/distill_vs_rl.py`, docs/experiments/distill_vs_rl.md.)"""
    teacher_dir, teacher_rows = quickstart
    warm = teacher_dir / "checkpoints" / "0"
    rows = _train(tmp_path / "student", *SHORT, f"train.steps={DISTILL_STEPS}",
                  f"train.eval_every={DISTILL_STEPS}", NO_TASK_REWARD, f"algorithm.distill.teacher={teacher_dir}",
                  "model.preset=null", f"model.checkpoint={warm}", "sft_warmup.steps=0")
    evals = {r["step"]: r for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [0, DISTILL_STEPS]
    before, after = evals[0], evals[DISTILL_STEPS]
    start = next(r for r in teacher_rows if r["step"] == 0)  # the warm start, kept exactly as step 0
    assert {k: v for k, v in before.items() if k.startswith("eval/")} == \
        {k: v for k, v in start.items() if k.startswith("eval/")}
    assert after["eval/accuracy"] > before["eval/accuracy"] + 0.3, (before, after)
    assert after["eval/reward/format/mean"] > 0.8 > 0.5 > before["eval/reward/format/mean"], (before, after)
    train = [r for r in rows if "distill/reverse_kl" in r]
    assert [r["step"] for r in train] == list(range(1, DISTILL_STEPS + 1))
    assert all(r["reward/mean"] == 0 and r["loss"] != 0 for r in train)  # the teacher's signal alone
    kl = [r["distill/reverse_kl"] for r in train]
    assert sum(kl[-2:]) / 2 < sum(kl[:2]) / 2, kl


@pytest.mark.slow  # ~40 s: 20 PPO steps (policy and critic updates) from the teacher run's step-0 checkpoint
def test_ppo_with_a_critic_learns_the_quickstart_task(quickstart, tmp_path):
    """Issue 28 item 1: PPO with a learned critic and GAE (`algorithm.name: ppo`, verl's defaults γ = λ = 1,
    value clip 0.5; the critic starts from the warm-started policy with a fresh head) on the quickstart's
    rewards, from the quickstart's warm start: held-out format and accuracy rise, the training reward rises,
    and the critic's value loss falls as its explained variance grows. (Seeds and spread against GDPO:
    `experiments/ppo_vs_grpo.py`, docs/experiments/ppo_vs_grpo.md.)"""
    warm = quickstart[0] / "checkpoints" / "0"
    rows = _train(tmp_path / "ppo", *SHORT, "algorithm.name=ppo", "model.preset=null",
                  f"model.checkpoint={warm}", "sft_warmup.steps=0")
    evals = {r["step"]: r for r in rows if "eval/accuracy" in r}
    before, after = evals[0], evals[20]
    assert after["eval/accuracy"] > before["eval/accuracy"] + 0.15, (before, after)
    assert before["eval/reward/format/mean"] < 0.5 < 0.9 < after["eval/reward/format/mean"], (before, after)
    train = [r for r in rows if "critic/vf_loss" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    assert mean(train[-5:], "reward/mean") > mean(train[:5], "reward/mean") + 0.3
    assert mean(train[-5:], "critic/vf_loss") < mean(train[:5], "critic/vf_loss")
    assert mean(train[-5:], "critic/vf_explained_var") > mean(train[:5], "critic/vf_explained_var")
