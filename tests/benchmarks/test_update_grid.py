"""benchmarks/update_grid.py's verdict (issue 33 item 7): a point is "yes" when jaxrl's update is >= 1.2x every
TRL side's tokens/s at <= its peak RSS; a TRL side killed for memory counts as beaten; `model.remat: full` is
shown (and judged) where the default update failed or missed and remat passes. Pure Python on hand-made
reports, no measurement."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import update_grid  # noqa: E402

OOM = {"error": "exit code -9"}


def _side(tok_s: float, rss: float) -> dict:
    return {"tokens_per_s": tok_s, "peak_rss_mib": rss}


def _report(jaxrl, group=8, **sides) -> dict:
    return {"prompt": 512, "completion": 512, "group": group, "jaxrl": jaxrl, **sides}


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


def test_yes_needs_both_speed_and_memory_against_every_trl_side():
    fast_small = _report(_side(130, 900), trl=_side(100, 1000), trl_ckpt=_side(100, 950))
    assert _cells(update_grid.row(fast_small))[-1] == "yes"
    assert _cells(update_grid.row(fast_small))[3] == "shared prompt"
    just_slow = _report(_side(119, 900), trl=_side(100, 1000))  # 1.19x
    assert _cells(update_grid.row(just_slow))[-1] == "**no**"
    heavier = _report(_side(130, 960), trl=_side(100, 1000), trl_ckpt=_side(100, 950))  # above trl-ckpt's RSS
    assert _cells(update_grid.row(heavier))[-1] == "**no**"
    assert update_grid.needs_remat(heavier) and not update_grid.needs_remat(fast_small)


def test_a_trl_side_killed_for_memory_is_beaten_only_by_a_jaxrl_side_that_ran():
    assert _cells(update_grid.row(_report(_side(50, 5000), group=1, trl=OOM)))[-1] == "yes"
    assert _cells(update_grid.row(_report(OOM, group=1, trl=OOM)))[-1] == "**no**"


def test_remat_full_is_shown_where_the_default_misses_and_it_passes():
    report = _report(_side(191, 10519), trl=OOM, trl_ckpt=_side(123, 8403),
                     jaxrl_remat_full=_side(174, 4751))  # SmolLM2 512 + 512 G8, 2026-11-30
    cells = _cells(update_grid.row(report))
    assert cells[3] == "shared prompt, remat full" and cells[4] == "174 (4751 MiB)" and cells[-1] == "yes"
    slow_remat = dict(report, jaxrl_remat_full=_side(140, 4751))  # 1.14x: the default's row stays, "no"
    cells = _cells(update_grid.row(slow_remat))
    assert cells[3] == "shared prompt" and cells[4] == "191 (10519 MiB)" and cells[-1] == "**no**"
    out_of_memory = dict(report, jaxrl=OOM)  # the default failed: remat full is the row's update
    assert _cells(update_grid.row(out_of_memory))[3] == "shared prompt, remat full"


def test_remat_dots_is_judged_first_and_full_where_dots_misses():
    """With both policies measured, the row is `remat dots` where it passes, else `remat full` where that passes
    (tiny 64 + 1024 G 1 on the AMD EPYC, 2026-12-01: the default 1.12x TRL-ckpt's memory)."""
    base = _report(_side(3558, 2255), group=1, trl=_side(2467, 3108), trl_ckpt=_side(2490, 2008))
    both = dict(base, jaxrl_remat_dots=_side(3300, 1900), jaxrl_remat_full=_side(3100, 1637))
    assert _cells(update_grid.row(both))[3] == "padded, remat dots"
    heavy_dots = dict(both, jaxrl_remat_dots=_side(3300, 2100))  # dots still above TRL-ckpt's memory
    assert _cells(update_grid.row(heavy_dots))[3] == "padded, remat full"
    neither = dict(heavy_dots, jaxrl_remat_full=_side(2925, 1637))  # 1.17x: the default's row stays, "no"
    cells = _cells(update_grid.row(neither))
    assert cells[3] == "padded" and cells[-1] == "**no**"


def test_remat_on_the_unpadded_update_and_a_point_measured_with_remat_only():
    """A remat side on `train.packing: auto`'s update (`jaxrl_packed_remat_P`) is named by the path it ran; a
    point measured with `--remat-only` (no default update) is judged on its remat sides, and one with no jaxrl
    side at all still needs one."""
    unpadded = {"train/packed": True, "train/unpadded": True}
    report = {"prompt": 64, "completion": 1024, "group": 1, "jaxrl": _side(113, 16791),
              "jaxrl_packed": dict(_side(140, 12000), **unpadded), "trl": OOM, "trl_ckpt": _side(98, 8355)}
    assert update_grid.needs_remat(report)
    with_mlp = dict(report, jaxrl_packed_remat_mlp=dict(_side(130, 8000), **unpadded))
    cells = _cells(update_grid.row(with_mlp))
    assert cells[3] == "unpadded, remat mlp" and cells[-1] == "yes" and not update_grid.needs_remat(with_mlp)
    only = {k: v for k, v in with_mlp.items() if k not in ("jaxrl", "jaxrl_packed")}
    assert _cells(update_grid.row(only))[3] == "unpadded, remat mlp"
    heavy_mlp = dict(only, jaxrl_packed_remat_mlp=dict(_side(130, 9000), **unpadded))
    assert update_grid.needs_remat(heavy_mlp)  # still above TRL-ckpt's memory: the next policy is measured
    with_full = dict(heavy_mlp, jaxrl_packed_remat_full=dict(_side(125, 6000), **unpadded))
    assert _cells(update_grid.row(with_full))[3] == "unpadded, remat full"
    assert update_grid.needs_remat({k: v for k, v in report.items() if k not in ("jaxrl", "jaxrl_packed")})


def test_a_table_of_points_measured_against_different_trl_sides_keeps_its_columns():
    """The grid's closing table has one column pair per TRL side asked for; a point measured without one of
    them (TRL out of memory there before, not re-run) says "not run" in its pair, and is judged on the sides
    it has."""
    both = _report(_side(130, 900), trl=_side(100, 1000), trl_ckpt=_side(100, 950))
    ckpt_only = _report(_side(130, 900), trl_ckpt=_side(100, 950))
    rows = [_cells(update_grid.row(r, ("trl", "trl_ckpt"))) for r in (both, ckpt_only)]
    assert len(rows[0]) == len(rows[1]) == 10
    assert rows[1][5] == "not run" and rows[1][7] == "100 (950 MiB)" and rows[1][-1] == "yes"
    assert rows[0][5] == "100 (1000 MiB)" and rows[0][7] == "100 (950 MiB)"
    assert _cells(update_grid.row(ckpt_only, ("trl_ckpt",))) == _cells(update_grid.row(ckpt_only))
