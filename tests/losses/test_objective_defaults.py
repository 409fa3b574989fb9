"""The config defaults of the policy objectives and the mismatch correction follow their references
(issue 28): GSPO / GSPO-token / SAPO aggregate per sequence unless `algorithm.agg_mode` says otherwise, CISPO
caps the IS weight at 1.2 with no lower bound, MIS drops rejected tokens from the mask (verl)."""

import pytest

from jaxrl.config import dump_config, load_config
from jaxrl.losses import AggMode

REFERENCE_AGG = {"ppo_clip": "token-mean", "gspo": "seq-mean-token-mean", "gspo_token": "seq-mean-token-mean",
                 "cispo": "token-mean", "sapo": "seq-mean-token-mean"}


@pytest.mark.parametrize("objective", sorted(REFERENCE_AGG))
def test_unset_agg_mode_is_the_objectives_reference_mode(objective, tmp_path):
    cfg = load_config(None, [f"algorithm.objective.name={objective}"])
    assert cfg.algorithm.agg_mode is AggMode(REFERENCE_AGG[objective])
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))  # the resolved config names the mode and loads back equal
    assert f"agg_mode: {REFERENCE_AGG[objective]}" in path.read_text() and load_config(path) == cfg


def test_explicit_agg_mode_wins_and_reaches_the_loss_spec():
    from jaxrl.algorithms import ALGORITHMS
    from jaxrl.rl.setup import algo_settings, loss_spec

    for overrides, expected in [(["algorithm.objective.name=gspo"], AggMode.SEQ_MEAN_TOKEN_MEAN),
                                (["algorithm.objective.name=sapo", "algorithm.agg_mode=token-mean"],
                                 AggMode.TOKEN_MEAN),
                                (["algorithm.agg_mode=seq-mean-token-sum-norm"], AggMode.SEQ_MEAN_TOKEN_SUM_NORM)]:
        cfg = load_config(None, overrides)
        spec = loss_spec(cfg, ALGORITHMS[cfg.algorithm.name], algo_settings(cfg))
        assert spec.agg is expected, overrides


def test_cispo_and_mismatch_defaults():
    cfg = load_config(None, ["algorithm.objective.name=cispo", "algorithm.mismatch.mode=mis"])
    from jaxrl.algorithms import ALGORITHMS
    from jaxrl.rl.setup import algo_settings, loss_spec

    m = cfg.algorithm.mismatch
    spec = loss_spec(cfg, ALGORITHMS[cfg.algorithm.name], algo_settings(cfg))
    # MiniMax-M1's one-sided form, verl example's cap
    assert spec.objective == "cispo" and dict(spec.objective_kwargs) == {"w_max": 1.2, "w_min": None}
    assert m.reject.value == "mask"
    cfg = load_config(None, ["algorithm.mismatch.mode=mis", "algorithm.mismatch.reject=zero_weight"])
    assert cfg.algorithm.mismatch.reject.value == "zero_weight"
