"""The node fleet without Ray: which loggers to start and retire, and how runs end."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._nodes import reconcile


def test_reconcile_starts_new_nodes_and_retires_gone_ones() -> None:
    assert reconcile(["w1", "w2"], ["w2", "w3"]) == (["w3"], ["w1"])
    assert reconcile([], []) == ([], [])


def test_a_run_whose_end_fails_does_not_hold_the_other_runs_ends(caplog: pytest.LogCaptureFixture) -> None:
    from ray_wandb_nodes._fleet import NodeFleet, _Logger, _Retirement
    from ray_wandb_nodes._nodes import NodeInfo
    from ray_wandb_nodes._warn import Warner

    class RefusingIndex:
        folder = "/nowhere"

        def set_writer(self, entry: dict[str, Any]) -> None:
            raise RuntimeError("the index refused")

    fleet = NodeFleet(init_timeout_s=1.0, warner=Warner())
    logger = _Logger(node=NodeInfo("a" * 56, "host", "10.0.0.1"), actor=None, pg_key=0)
    ended: list[str] = []
    failing = _Retirement(
        run_id="run-a", refs={}, deadline=0.0, timeout=1.0, then=None, index=RefusingIndex(), sources=[logger]
    )
    failing.collectors = []  # its collection is over; recording what was left fails
    fine = _Retirement(run_id="run-b", refs={}, deadline=0.0, timeout=1.0, then=lambda: ended.append("run-b"))
    fleet._retirements = [failing, fine]
    fleet._check_retirements()
    assert ended == ["run-b"] and fleet._retirements == []
    assert "ending the W&B run run-a failed (RuntimeError: the index refused)" in caplog.text
