"""Environments that break the `Env` contract fail cleanly (issue 30 item 2): one EnvError line naming the
class, the method, the record / turn and what was expected (exit 2); on_error "end_episode" ends the episode
with return 0 and counts it (the reward-failure guard then stops a run whose env always fails); a hung step
is cut by step_timeout_s; the setup dry run catches a broken env before any rollout; a tool's bad parameter
is a config error."""

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jaxrl.rl import agentic
from jaxrl.envs import Action, EpisodeBudget, SearchEnv, StepResult, make_env, prompt_ids, scripted_episodes
from jaxrl.envs.contract import dry_run
from jaxrl.errors import ConfigError, EnvError, UserError
from jaxrl.rewards import RewardFailureTracker
from jaxrl.sampling import SamplingSpec
from jaxrl.io.tokenizer import builtin_tokenizer

TOK = builtin_tokenizer()
REPO = Path(__file__).resolve().parents[2]
RECORDS = [{"question": "Who?"}, {"question": "Why?"}]
SPEC = EpisodeBudget(max_turns=3, max_total_tokens=256, row_buckets=(256,))


class ScriptEnv:
    """Returns `bad` from `method` at turn `at` (1-based; reset: turn 0); well-behaved otherwise."""

    stop_strings = ()

    def __init__(self, tokenizer, method="step", bad=None, at=1, only=None):
        self.tokenizer, self.method, self.bad, self.at, self.only = tokenizer, method, bad, at, only
        self.k = 0

    def _fails(self):
        return self.bad is not None and (self.only is None or self.record["question"] == self.only)

    def reset(self, record):
        self.record, self.k = record, 0
        if self.method == "reset" and self._fails():
            return self.bad
        return prompt_ids(self.tokenizer, [{"role": "user", "content": record["question"]}])

    def step(self, action):
        self.k += 1
        if self.method == "step" and self.k == self.at and self._fails():
            if isinstance(self.bad, BaseException):
                raise self.bad
            if callable(self.bad):
                return self.bad()
            return self.bad
        done = self.k >= 2
        return StepResult([] if done else self.tokenizer.encode(" more", add_special_tokens=False), 1.0, done)

    def demonstration(self, record):
        return self.bad if self.method == "demonstration" else ["a", "b"]


def _play(records=RECORDS, spec=SPEC, **kw):
    return scripted_episodes(records, TOK, lambda tok: ScriptEnv(tok, **kw), lambda r: ["a", "b"], spec)


@pytest.mark.parametrize("method, bad, at, expected", [
    ("step", (["x"], 1.0, True), 1, r"ScriptEnv.step \(record 0, turn 1\): returned a tuple; expected "
                                    r"jaxrl.envs.StepResult"),
    ("step", lambda: StepResult([5, 999], 0.0, False), 2,
     r"ScriptEnv.step \(record 0, turn 2\): the observation holds id 999, outside the vocabulary \[0, 102\)"),
    ("step", lambda: StepResult([-1], 0.0, False), 1, r"holds id -1, outside the vocabulary"),
    ("step", lambda: StepResult("text", 0.0, False), 1, r"observation is a str; expected a list of integer"),
    ("step", lambda: StepResult([], 0.0, False), 1, r"empty observation with done=False"),
    ("step", lambda: StepResult([], math.nan, True), 1, r"turn 1\): reward nan is not a finite number"),
    ("step", lambda: StepResult([], None, True), 1, r"reward None is not a finite number"),
    ("step", lambda: StepResult([], 1.0, "yes"), 1, r"done is a str; expected a bool"),
    ("step", ValueError("tool exploded"), 2, r"ScriptEnv.step \(record 0, turn 2\) raised ValueError: tool "
                                             r"exploded at .*test_env_contract.py:\d+"),
    ("reset", [], 0, r"ScriptEnv.reset \(record 0\): returned an empty prompt"),
    ("reset", "What?", 0, r"ScriptEnv.reset \(record 0\): the prompt is a str; expected a list of integer"),
    ("reset", [1, 2, 500], 0, r"ScriptEnv.reset \(record 0\): the prompt holds id 500, outside the vocab"),
])
def test_each_violation_is_one_line_naming_class_method_turn(method, bad, at, expected):
    with pytest.raises(EnvError, match=expected) as info:
        _play(method=method, bad=bad, at=at)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, UserError)  # the CLI's exit 2


def test_demonstration_that_is_a_string_is_refused():
    factory = make_env(f"{__name__}:ScriptEnv", {"method": "demonstration", "bad": "<a>1</a>"})
    with pytest.raises(EnvError, match=r"ScriptEnv.demonstration \(record 0\): returned a str; expected a "
                                       r"list of action texts"):
        agentic.demonstration_rows(RECORDS, TOK, factory, SPEC)
    with pytest.raises(EnvError, match=r"policy of ScriptEnv \(record 0\) returned .ab.; expected"):
        scripted_episodes(RECORDS, TOK, ScriptEnv, lambda r: "ab", SPEC)


def test_end_episode_scores_zero_counts_and_the_guard_stops_the_run():
    spec = EpisodeBudget(max_turns=3, max_total_tokens=256, row_buckets=(256,), on_error="end_episode")
    eps = _play(spec=spec, bad=lambda: StepResult([], math.inf, True), at=2, only="Why?")
    np.testing.assert_array_equal(eps.rewards_B, [2.0, 0.0])  # record 1's turn-1 reward is dropped too
    np.testing.assert_array_equal(eps.errors_B, [False, True])
    assert eps.metrics["env/errors"] == 1.0 and "reward inf is not a finite number" in eps.first_error
    ro = agentic.to_rollout(eps, [], TOK)
    tracker = RewardFailureTracker(3)
    for _ in range(3):
        tracker.update(*ro.score_infos)  # one episode of two failed: never stops
    every = _play(spec=spec, bad=RuntimeError("down"), at=1)
    assert every.errors_B.all() and every.rewards_B.tolist() == [0.0, 0.0]
    failing = agentic.to_rollout(every, [], TOK).score_infos
    tracker.update(*failing)
    tracker.update(*failing)
    with pytest.raises(UserError, match=r"'env' failed on every sample for 3 consecutive steps .*raised "
                                        r"RuntimeError: down"):
        tracker.update(*failing)


def test_a_hung_step_is_cut_by_step_timeout():
    release = threading.Event()

    def hang():
        release.wait(30)
        return StepResult([], 1.0, True)

    try:
        t0 = time.perf_counter()
        with pytest.raises(EnvError, match=r"ScriptEnv.step \(record 0, turn 1\) did not return within "
                                           r"env.step_timeout_s=0.2 s"):
            _play(spec=EpisodeBudget(max_turns=3, step_timeout_s=0.2), bad=hang)
        ended = _play(spec=EpisodeBudget(max_turns=3, step_timeout_s=0.2, on_error="end_episode"), bad=hang)
        assert ended.errors_B.tolist() == [True, True] and time.perf_counter() - t0 < 5
        ok = _play(spec=EpisodeBudget(max_turns=3, step_timeout_s=5.0))  # a timely step is unaffected
        assert ok.rewards_B.tolist() == [2.0, 2.0] and not ok.errors_B.any()
    finally:
        release.set()


def test_setup_dry_run_stops_a_broken_env_before_any_rollout():
    factory = make_env(f"{__name__}:ScriptEnv", {"bad": (["x"], 1.0, True)}, tokenizer=TOK)
    with pytest.raises(EnvError, match=r"ScriptEnv.step \(record 0, turn 1\): returned a tuple"):
        # the model is never touched: the dry run fails first
        agentic.collect_env(None, None, RECORDS, TOK, [], factory, SPEC, SamplingSpec(max_new_tokens=8), 0)
    assert not factory.checked
    good = make_env(f"{__name__}:ScriptEnv", {}, tokenizer=TOK)
    dry_run(good, RECORDS[0], TOK)


def test_a_tool_parameter_error_is_a_config_error():
    with pytest.raises(ConfigError, match="top_k must be >= 1"):
        make_env("search", {"corpus_size": "tiny", "top_k": 0}, tokenizer=TOK)
    env = SearchEnv(TOK, corpus_size="tiny")  # a bad call is an observation to the model, never a crash
    env.reset({"question": "q", "answers": ["a"]})
    text = "<search> </search>"
    res = env.step(Action(tuple(TOK.encode(text, add_special_tokens=False)), text, False))
    assert res.info["tool_errors"] == 1 and not res.done


class TupleEnv(ScriptEnv):
    """A step that returns a tuple (the common mistake), for the CLI."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, bad=(["x"], 1.0, True))

    def reset(self, record):
        return super().reset({"question": record["prompt"]})


def test_train_with_a_broken_env_exits_2_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "jaxrl.cli", "train", "--run-dir", str(tmp_path / "run"),
            "--set", f"env={{name: '{__file__}:TupleEnv'}}", "--set", "sft_warmup.steps=0",
            "--set", "train.eval_every=0", "--set", "train.steps=2"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["jaxrl train: error: TupleEnv.step (record 0, turn 1): returned a tuple; expected "
                      "jaxrl.envs.StepResult(observation, reward, done, info)"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
