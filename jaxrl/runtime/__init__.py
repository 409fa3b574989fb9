"""What runs around a training job: the process group (`distributed`), host memory (`host_memory`), the run
directory and its lock (`run_dir`, `run_lock`), the checks before heavy work (`run_checks`), metrics and their
trackers (`metrics`, `trackers`), the step-time breakdown (`step_time`), progress and the run summary
(`progress`, `run_summary`), and the guard that keeps sharded XLA:CPU loop programs out of JAX's persistent
compilation cache (`compile_cache`).
"""
