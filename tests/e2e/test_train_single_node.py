"""One node: the primary covers it; no logger actor, no extra process."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cluster import node_labels, node_logger_count
from tests.support.runs import rank_console, run_of, unique, user_rows
from tests.support.training import REPORTS, fit, make_callback, said
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster

# The cluster: tests/e2e/conftest.py's head_only fixture.
TOPOLOGY = "head_only"


def test_single_node_run_has_no_logger_actor_and_its_node_label(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("single")
    result = fit(name, make_callback(nodes="cluster"), str(tmp_path))
    assert result.error is None
    run = run_of(backend, name)
    assert run.labels == set(node_labels().values())
    assert len(run.labels) == 1
    assert len(run.client_ids) == 1
    assert [row["step"] for row in user_rows(run)] == list(range(REPORTS))
    assert run.exit_codes == [0]
    assert node_logger_count() == 0
    # The ranks on the controller's node have no node writer: the primary writes rank 0's console
    # (the default), each print once, under the node's label; the healthy rank 1's stays out.
    console = rank_console(run)
    assert [text for _, text in console[0] if text.startswith("rank 0 ")] == [said(0, s) for s in range(REPORTS)]
    assert {label for label, _ in console[0]} == run.labels
    assert 1 not in console, console.get(1)
