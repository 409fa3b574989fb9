"""The RL middle: setup, the step, its plug-ins and the loop around them.

* `jaxrl.rl.setup`: the only reader of the experiment config below the CLI; builds the `Run`
  (`jaxrl.rl.run`) and picks one implementation of each plug-in;
* the plug-ins, each resolved once at setup (the step never asks which one it got):
  `jaxrl.rl.policy` (how the trained parameters become the sampling parameters, the KL reference and the
  train view of one role: `Dense`, `LoRA`, `PerRoleAdapters`), `jaxrl.rl.collect` (how a step's rows are
  produced, with the warm start's demonstrations and the state checkpoints carry: `SingleTurn`,
  `EnvEpisodes`, `SystemRows`) and `jaxrl.rl.update` (how one rollout's advantages become optimiser steps:
  `Joint`, `Phased`); and `jaxrl.rl.ahead`, where each step's rollout comes from (`Synchronous`, or
  `Ahead`: collected ahead by a policy up to `train.async.max_staleness` versions older; `jaxrl.rl.partial`:
  `Partial`, its rows in flight continued under the newest weights, and `make_feed`, the choice);
* `jaxrl.rl.step`: one RL step, a straight line of stages; `jaxrl.rl.batch`: the train batch of a rollout
  and the optimiser steps over it; `jaxrl.rl.distill`: on-policy distillation's teacher, a batch stage;
* `jaxrl.rl.agentic`: environment episodes as rollouts and demonstrations (the `EnvEpisodes` collector's
  machinery); `jaxrl.rl.evaluate`: greedy held-out evaluation (the loop's and `jaxrl eval`'s);
* `jaxrl.rl.warm_start`: the supervised warm start, its rows packed by `jaxrl.rl.packing`; `jaxrl.rl.loop`:
  `train`, the hooks between steps.

The package's `__init__` imports nothing, so that importing one module does not build the others.
"""
