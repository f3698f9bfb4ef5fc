"""W&B runs as the test backend recorded them: find one by name, its rows, its writers; and unique
names, so that tests sharing one cluster and one backend never meet each other's runs."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support.wandb_backend import WandbTestBackend


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_of(backend: WandbTestBackend, name: str) -> Any:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    assert len(runs) == 1, f"expected one run named {name}, got {[r.run_id for r in runs]}"
    return runs[0]


HEALTH_KEYS = {"nodes", "nodes/stragglers"}


def user_rows(run: Any) -> list[dict[str, Any]]:
    """The history rows training reported (not the node table's and straggler count's rows)."""
    return [
        {k: v for k, v in row.items() if not k.startswith("_")} for row in run.history if not HEALTH_KEYS & set(row)
    ]


def assert_one_writer_per_label(run: Any) -> None:
    """Every label comes from exactly one writer: no node is sampled twice."""
    seen = [label for labels in run.labels_by_client().values() for label in labels]
    assert sorted(seen) == sorted(set(seen)), run.labels_by_client()
