"""jaxrl.learner: the jitted update every trainer of the library runs.

  train_step.py   the RL update: one optimiser step over a mini-batch of rows, with gradient accumulation and
                  a skip on a non-finite step (`TrainBatch`, `TrainState`, `LossSpec`, `jitted_train_step`,
                  `jitted_logprob_pass`)
  optim.py        `build_optimizer`: the one optax transformation of RL and reward-model training

It sits beside `jaxrl.sampling` (which turns parameters into rows): the learner turns rows into parameters.
Both are below `jaxrl.rl`, so plug-ins (algorithms, multi-agent systems) use their records without importing
the RL middle.
"""
