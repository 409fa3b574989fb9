"""Every command in README.md's ```bash blocks runs verbatim (issue 14 item 8), only shortened.

The blocks are read from README.md itself, so a command added or changed there is tested without editing this
file. Each command runs in README order (later ones use the runs earlier ones made) in a scratch directory
holding a link to the repository's `configs/`, as a subprocess of the installed `jaxrl` script, with:

* `~` pointing at a scratch home directory, in which tiny stand-ins sit where the README expects real models
  (`~/.cache/jaxrl/smollm2-135m-instruct-float32`, `~/models/Qwen3-0.6B`): same family and layout, a few
  thousand parameters, jaxrl's built-in tokenizer and chat template;
* fewer steps, appended after the command's own arguments (a later `--set` wins), from `REDUCE` by
  sub-command (a train whose config has an SFT warm-up gets one SFT step; one without gets none, as written);
  a sub-command missing there runs exactly as written;
* one CPU device (the test session's 8 fake devices are not passed on);
* one persistent XLA compilation cache for all of them: the suite's (`JAX_COMPILATION_CACHE_DIR`, which
  `make test` sets) or, when none is set, an empty one of this module's, so that a program two commands
  compile (the two `configs/smollm2_arithmetic.yaml` trains compile the same ones) is compiled once;
* `jaxrl launch` run from the repository (it ships the checkout's HEAD) and only as `--dry-run`.

`make ...` lines are not run here: they create a virtualenv and run the whole suite or the full-length
quickstart; `.ci/run` runs both README `make` commands itself (the quickstart in a core-only virtualenv).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests._xla import xla_flags

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BIN = Path(sys.executable).parent

# prompt buckets: the quickstart's 32 tokens, and 256 for the chat-templated SmolLM2 prompts in the stand-in's
# character tokenizer (a run compiles the one bucket its prompts need)
_TRAIN = ["train.steps=1", "train.eval_every=0", "data.prompts_per_step=2", "rollout.group_size=2",
          "rollout.max_new_tokens=4", "rollout.gen_buckets=[4]", "rollout.prompt_buckets=[32,256]"]
_TRAIN_RM = ["train.steps=3", "train.eval_every=0", "debias.warmup_steps=1", "data.train_size=128",
             "data.eval_size=64"]
# sub-command -> arguments appended to shorten it (sub-commands not listed run exactly as written)
REDUCE: dict[str, list[str]] = {
    "train": [a for key in _TRAIN for a in ("--set", key)],
    "train-rm": [a for key in _TRAIN_RM for a in ("--set", key)],
    "eval": ["--limit", "2"],  # of the run's 64 held-out prompts: one batch, greedy and --k samples
}
SKIP_PROGRAMS = {"make": "creates a virtualenv and runs the whole suite / full quickstart; .ci/run runs it"}
# sub-commands run from the repository itself: `launch` ships `git archive HEAD` of the checkout it runs in
# (README shows it with --dry-run, which only prints the commands; the test insists on that)
IN_REPO = {"launch"}
TIMEOUT_S = 1800  # a shared, loaded CPU: the shortened train once took 10 min


def bash_commands(markdown: str) -> list[str]:
    """The shell commands of a Markdown text's ```bash blocks: continuation lines joined, comments and blank
    lines dropped, in order."""
    commands = []
    for block in re.findall(r"^```bash[ \t]*\n(.*?)^```", markdown, flags=re.M | re.S):
        text = re.sub(r"\\\n", " ", block)
        for line in text.splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(shlex.join(argv))
    return commands


def test_bash_commands_parser():
    text = ("intro\n```bash\nmake quickstart\n```\n```python\nx = 1\n```\n"
            "```bash\n# only a comment\njaxrl train a.yaml \\\n  --set x=1   # trailing comment\n\n"
            "jaxrl plot 'runs/a b'\n```\n")
    assert bash_commands(text) == ["make quickstart", "jaxrl train a.yaml --set x=1", "jaxrl plot 'runs/a b'"]


def _expand_home(arg: str, home: Path) -> str:
    """bash's tilde expansion of an unquoted word (`~` or `~/...`)."""
    return str(home) + arg[1:] if arg == "~" or arg.startswith("~/") else arg


def _stand_in(path: Path, family: str) -> None:
    """A tiny `family` model with jaxrl's built-in tokenizer, saved as an HF directory at `path`."""
    from flax import nnx

    from jaxrl.io import tokenizer
    from jaxrl.io import hf
    from jaxrl.models import Transformer, TransformerConfig

    tok = tokenizer.load_tokenizer("builtin")
    cfg = TransformerConfig.tiny(vocab_size=len(tok), max_position_embeddings=512, family=family,
                                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id, qk_norm=family == "qwen3")
    hf.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), path, tok)


def _sft_steps(args: list[str]) -> int:
    """`sft_warmup.steps` of a `jaxrl train ARGS` command: its config (the embedded default when the first
    argument is an option) with its `--set` overrides."""
    from jaxrl.config import load_config

    config = None if not args or args[0].startswith("-") else str(REPO / args[0])
    sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    return load_config(config, sets).sft_warmup.steps


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    home = root / "home"
    _stand_in(home / ".cache" / "jaxrl" / "smollm2-135m-instruct-float32", "llama")
    _stand_in(home / "models" / "Qwen3-0.6B", "qwen3")
    cwd = root / "work"
    cwd.mkdir()
    (cwd / "configs").symlink_to(REPO / "configs")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_CACHE")} | {"XLA_FLAGS": xla_flags()}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", JAX_PLATFORMS="cpu",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if not env.get("JAX_COMPILATION_CACHE_DIR"):  # cold at the start, shared by this module's commands
        env.update(JAX_COMPILATION_CACHE_DIR=str(root / "jax-cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    return cwd, home, env


COMMANDS = bash_commands(README.read_text())


def test_readme_has_commands():
    programs = {shlex.split(c)[0] for c in COMMANDS}
    assert len(COMMANDS) >= 10 and "jaxrl" in programs, COMMANDS


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=[c[:60] for c in COMMANDS])
def test_readme_command_runs(command, workspace):
    cwd, home, env = workspace
    argv = shlex.split(command)
    if argv[0] in SKIP_PROGRAMS:
        pytest.skip(f"{argv[0]}: {SKIP_PROGRAMS[argv[0]]}")
    argv = [_expand_home(a, home) for a in argv]
    sub = argv[1] if argv[0] == "jaxrl" and len(argv) > 1 else None
    argv += REDUCE.get(sub, [])
    if sub == "train" and _sft_steps(argv[2:]):
        argv += ["--set", "sft_warmup.steps=1"]  # shortened, not added: a config without one runs none
    if sub in IN_REPO:
        assert "--dry-run" in argv, f"README runs `jaxrl {sub}` for real; the test runs it only as --dry-run"
        cwd = REPO
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README command did not finish in {TIMEOUT_S} s: {command}")
    assert proc.returncode == 0, (
        f"README command failed (exit {proc.returncode}): {command}\n"
        f"ran: {shlex.join(argv)}\n--- output (tail) ---\n{(proc.stdout + proc.stderr)[-3000:]}")
