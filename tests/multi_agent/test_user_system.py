"""A multi-agent system written by a user (`docs/multi_agent_user_system.py:DraftRevise`, named by path in
the config, no registration) trains through the real CLI: two roles of one policy, the reviser's rows a role
segment of their own, the policy updated on them (issue 26 item 7)."""

from __future__ import annotations

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.train._common import ROOT, metrics, run_train

SYSTEM = f"{ROOT}/docs/multi_agent_user_system.py:DraftRevise"


@pytest.mark.slow  # one short CLI run of the tiny model (~15 s)
def test_a_user_multi_agent_system_trains_through_the_cli(tmp_path):
    run_dir = tmp_path / "user_system"
    proc = run_train(run_dir, f"multi_agent.system={SYSTEM}", "multi_agent.params={train_roles: [reviser]}",
                     "rollout.prompt_buckets=[64]", "data.source=arithmetic")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in metrics(run_dir) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert np.isfinite(r["role/reviser/reward/mean"]) and r["role/reviser/response_length/mean"] > 0
        assert r["role/drafter/response_length/mean"] > 0  # the drafter played (untrained)
        assert r["train/grad_norm"] > 0 and r["train/nonfinite"] == 0

    def params(step):
        tree = ocp.StandardCheckpointer().restore((run_dir / "checkpoints" / str(step) / "params").resolve())
        return jax.tree.leaves(tree)

    assert any(not np.array_equal(a, b) for a, b in zip(params(1), params(2), strict=True))  # the policy moved
