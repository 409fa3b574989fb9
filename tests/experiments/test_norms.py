"""experiments/norms.py: corpus, unigram ceiling and divergence rule by hand; the vmapped learning-rate sweep
trains each (lr, seed) exactly like a sweep of that configuration alone, and a small learning rate lowers the
loss for every norm.

No norm-vs-norm direction is asserted: at CI scale (1 layer, a few steps) none is robust.
"""

import numpy as np
import pytest

from experiments import norms


def test_unigram_entropy_by_hand():
    rows = np.array([[1, 1, 2, 3]])  # p = 1/2, 1/4, 1/4
    assert norms.unigram_entropy(rows) == pytest.approx(-(0.5 * np.log(0.5) + 2 * 0.25 * np.log(0.25)))


def test_diverged_rule():
    assert not norms.diverged(np.array([4.0, 3.0]), 2.9, ceiling=3.0)
    assert norms.diverged(np.array([4.0, np.nan, 3.0]), 2.0, ceiling=3.0)   # NaN at any step
    assert norms.diverged(np.array([4.0, 3.0]), 3.1, ceiling=3.0)           # above the unigram ceiling
    assert norms.diverged(np.array([4.0, 3.0]), np.inf, ceiling=3.0)


def test_corpus_rows():
    rows, vocab = norms.corpus_rows(32)
    assert rows.ndim == 2 and rows.shape[1] == 32 and rows.shape[0] > 50
    assert rows.max() < vocab <= 128
    assert 1.5 < norms.unigram_entropy(rows) < np.log(vocab)


@pytest.mark.parametrize("norm", norms.NORMS)
def test_sweep_matches_single_runs_and_learns(norm):
    rows, vocab = norms.corpus_rows(32)
    kw = dict(steps=6, batch=4, seq_len=32, layers=1, dim=32, rows_RL=rows, vocab=vocab)
    both = norms.sweep(norm, [1e-4, 1e-2], [0, 1], **kw)
    alone = norms.sweep(norm, [1e-2], [1], **kw)
    assert both["train_CT"].shape == (4, 6) and both["eval_C"].shape == (4,)
    # lr-major order: (1e-4, 0), (1e-4, 1), (1e-2, 0), (1e-2, 1)
    np.testing.assert_allclose(both["train_CT"][3], alone["train_CT"][0], rtol=2e-4)
    np.testing.assert_allclose(both["eval_C"][3], alone["eval_C"][0], rtol=2e-4)
    # same init per seed: the first step's loss depends on the seed (init, batch), not on the lr
    np.testing.assert_allclose(both["train_CT"][0, 0], both["train_CT"][2, 0], rtol=1e-5)
    assert both["train_CT"][0, 0] != pytest.approx(both["train_CT"][1, 0], rel=1e-4)
    # lr 1e-2 lowers the training loss within 6 steps, for both seeds
    assert np.all(both["train_CT"][2:, -1] < both["train_CT"][2:, 0] - 0.3), both["train_CT"]


def test_report_only_reads_the_kept_sweeps(tmp_path):
    # hand-made sweeps of 2 lrs x 1 seed: pre learns at both, post has a NaN at lr 1e-1, siamese ends above
    # the ceiling at lr 1e-1
    curve = np.array([[4.0, 2.0], [4.0, 2.5]])
    kept = {"pre": (curve, [1.5, 2.0]), "post": (np.array([[4.0, 2.0], [4.0, np.nan]]), [1.6, 1.0]),
            "siamese": (curve, [1.4, 9.0])}
    for norm, (train_CT, eval_C) in kept.items():
        np.savez(tmp_path / f"{norm}.npz", train_CT=train_CT, eval_C=np.asarray(eval_C))
    norms.main(["--seeds", "0", "--lrs", "1e-3", "1e-1", "--raw", str(tmp_path), "--report-only",
                "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "norms.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 0.")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert cells[0][0] == "0.001" and cells[0][1::2] == ["0/1", "0/1", "0/1"]
    assert cells[1][0] == "0.1" and cells[1][1::2] == ["0/1", "1/1", "1/1"]
    assert cells[0][2].startswith("1.500 ± 0.000") and cells[1][4] == "—"
