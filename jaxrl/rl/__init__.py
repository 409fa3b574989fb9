"""The RL step's plug-ins, each resolved once at setup (`jaxrl.trainer.setup`); the step never asks which one
it got:

* `jaxrl.rl.policy`: how the trained parameters become the sampling parameters, the KL reference and the
  train view of one role (`Dense`, `LoRA`, `PerRoleAdapters`);
* `jaxrl.rl.collect`: how a step's rows are produced, with the warm start's demonstrations and the state
  checkpoints carry (`SingleTurn`, `EnvEpisodes`, `SystemRows`);
* `jaxrl.rl.update`: how one rollout's advantages become optimiser steps (`Joint`, `Phased`).

The package's `__init__` imports nothing: its modules import `jaxrl.trainer`'s neighbours, and `trainer`
imports them.
"""
