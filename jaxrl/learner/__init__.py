"""jaxrl.learner: the jitted update every trainer of the library runs.

  train_step.py   the RL update: one optimiser step over a mini-batch of rows, with gradient accumulation and
                  a skip on a non-finite step (`TrainBatch`, `TrainState`, `LossSpec`, `jitted_train_step`,
                  `jitted_logprob_pass`)
  optim.py        `build_optimizer`: the one optax transformation of RL and reward-model training
  cpu_compile.py  `cpu_jit`: the update's XLA:CPU programs with YNNPACK's dot fusion, guarded against the
                  fusion jaxlib 0.10.2 crashes on

It sits beside `jaxrl.sampling` (which turns parameters into rows): the learner turns rows into parameters.
Both are below `jaxrl.rl`, so plug-ins (algorithms, multi-agent systems) use their records without importing
the RL middle.
"""
