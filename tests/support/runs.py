"""W&B runs as the test backend recorded them: find one by name, its rows, its writers; and unique
names, so that tests sharing one cluster and one backend never meet each other's runs."""

from __future__ import annotations

import re
import uuid
from typing import Any

from tests.support.wandb_backend import WandbTestBackend


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_of(backend: WandbTestBackend, name: str) -> Any:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    assert len(runs) == 1, f"expected one run named {name}, got {[r.run_id for r in runs]}"
    return runs[0]


# The health rows' keys; "ranks/_type": a transaction log (offline) flattens a table's reference
# (ranks/_type, ranks/path, ...), and the run's last ranks table can come in a row of its own.
HEALTH_KEYS = {
    "nodes", "nodes/stragglers", "hangs", "ranks", "ranks/_type", "ranks/slow", "ranks/lateness_ms",
    "ranks/input_wait_ms",
}  # fmt: skip


def user_rows(run: Any) -> list[dict[str, Any]]:
    """The history rows training reported (not the node table's and straggler count's rows)."""
    return [
        {k: v for k, v in row.items() if not k.startswith("_")} for row in run.history if not HEALTH_KEYS & set(row)
    ]


# The titles of a failed attempt's alert (``_failure.words``) and of a recovery's.
_FAILURE_TITLE = re.compile(
    r"^(Attempt \d+: )?(Ranks? [\d,-]+( failed| stuck)?: |Training failed: )|^Attempt \d+ recovered$"
)


def failure_alerts(run: Any) -> list[dict[str, Any]]:
    """The run's alerts of failed attempts and recoveries, in the order they came."""
    return [a for a in run.alerts if _FAILURE_TITLE.match(str(a["title"]))]


def final_table(run: Any) -> dict[str, dict[str, Any]]:
    """The last ``nodes`` table the run logged, node label -> its row."""
    tables = run.tables("nodes")
    assert tables, "no node table was logged"
    return {row["node"]: row for row in tables[-1]}


def assert_one_writer_per_label(run: Any) -> None:
    """Every label comes from exactly one writer: no node is sampled twice."""
    seen = [label for labels in run.labels_by_client().values() for label in labels]
    assert sorted(seen) == sorted(set(seen)), run.labels_by_client()


def gpu_checks(run: Any, label: str, *, table: bool = True) -> dict[str, bool]:
    """What a GPU node's writer must have sent, as named checks: the same on a real GPU
    (``bench/gpu_check.py``) and on the scripted NVML (``tests/e2e/test_gpu.py``). ``table``: the
    run's last ``nodes`` table must have the node's GPU columns (wandb 0.31, see ``env``)."""
    series = run.system_metrics().get(label, {})
    tables = run.tables("nodes")
    row = next((r for r in tables[-1] if r["node"] == label), None) if tables else None
    util = series.get("gpu.0.gpu", [])
    checks = {
        "the node's writer joined": label in run.labels,
        "gpu.0.gpu, memoryAllocated, temp and powerWatts from the GPU node": {
            f"gpu.0.{k}" for k in ("gpu", "memoryAllocated", "temp", "powerWatts")
        }
        <= set(series),
        "GPU utilisation above 0 at least once": any(v > 0 for v in util),
    }
    if table:
        checks["the node table has the node's GPU columns"] = (
            bool(row) and row.get("gpu_util_mean") is not None and row.get("gpu_mem") is not None
        )
    return checks


_RANK_LINE = re.compile(r"^\[rank (\d+)\] (.*)$", re.S)


def rank_console(run: Any) -> dict[int, list[tuple[str | None, str]]]:
    """Each rank's lines in the run's console (the plugin writes them as ``[rank N] text``): the
    writer's label and the rank's text, in the order each writer sent them."""
    out: dict[int, list[tuple[str | None, str]]] = {}
    for line in run.console():
        m = _RANK_LINE.match(line.text)
        if m:
            out.setdefault(int(m[1]), []).append((line.label, m[2]))
    return out


def rank_labels(run: Any) -> dict[int, str]:
    """The label of each rank's node, as the run config's ``ray_train.ranks_by_node`` says."""
    by_node = run.config["ray_train"]["value"]["ranks_by_node"]
    return {rank: label for label, ranks in by_node.items() for rank in ranks}
