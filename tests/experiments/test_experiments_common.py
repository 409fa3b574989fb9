"""experiments.common: the stored-runs helper behind every script's --report-only."""

import argparse

import numpy as np

from experiments import common


def test_stored_runs_keeps_only_seeds_with_every_method(tmp_path):
    for name in ("a0", "b0", "a1", "a2", "b2"):  # seed 1 lacks method b
        np.savez(tmp_path / f"{name}.npz", x=np.asarray([len(name)]))
    load = lambda path: path.stem
    seeds, runs = common.stored_runs(tmp_path, [0, 1, 2, 3], ["a", "b"], load)
    assert seeds == [0, 2]
    assert runs == {"a": ["a0", "a2"], "b": ["b0", "b2"]}


def test_saved_arrays_round_trip_into_stored_runs(tmp_path):
    run = {"eval_steps": np.asarray([0.0, 10.0]), "probe": np.asarray([[0.25, 0.5], [0.5, 0.75]])}
    common.save_arrays(tmp_path / "raw" / "grpo3.npz", run)  # creates the folder
    seeds, runs = common.stored_runs(tmp_path / "raw", [3, 4], ["grpo"], common.load_arrays)
    assert seeds == [3]
    assert runs["grpo"][0].keys() == run.keys()
    for k in run:
        np.testing.assert_array_equal(runs["grpo"][0][k], run[k])


def test_raw_arguments():
    p = argparse.ArgumentParser()
    common.add_raw_arguments(p)
    a = p.parse_args(["--raw", "d", "--report-only"])
    assert str(a.raw) == "d" and a.report_only
    assert p.parse_args([]).raw is None


def test_probing_keeps_whole_results_when_asked():
    from jaxrl.rl import loop as rl_loop

    real = rl_loop.evaluate
    fake = lambda collect, params, records, encoder, spec, *, batch_size, **kw: {"eval/accuracy": len(records)}
    rl_loop.evaluate = fake
    try:
        with common.probing({"a": [{}] * 2}, metric=None) as log:
            assert rl_loop.evaluate(None, None, [{}] * 5, None, None, batch_size=4) == {"eval/accuracy": 5}
        assert log == [{"a": {"eval/accuracy": 2}}] and rl_loop.evaluate is fake
    finally:
        rl_loop.evaluate = real
