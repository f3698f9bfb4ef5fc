"""``report``: per-node summaries and outlier flags (pure, on synthetic samples), and the text,
JSON and PNG of an offline run that the real wandb client wrote, through the command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes import cli
from ray_wandb_nodes._wandb.txlog import RunLog, read_run
from ray_wandb_nodes._wandb.writers import Role
from ray_wandb_nodes.report.summary import NodeSummary, RunReport, flag
from tests.support.offline import offline_run, write_offline_run
from tests.support.runs import unique

__all__ = ["offline_run"]  # the shared fixture, imported for pytest to find


# outliers (pure) -------------------------------------------------------------------------------
def synthetic(label: str, gpu_util: float, cpu: float = 50.0, workers: bool | None = None) -> RunLog:
    samples = [
        (float(t), {"cpu": cpu, "memory_percent": 40.0, "gpu.0.gpu": gpu_util, "gpu.1.gpu": gpu_util,
                    "gpu.0.memoryAllocated": 70.0, "network.sent": 1e6 * t, "network.recv": 2e6 * t})
        for t in range(10)
    ]  # fmt: skip
    return RunLog(path=f"/x/{label}/run-r.wandb", run_id="r", stats={label: samples})


def report_of(*logs: RunLog) -> RunReport:
    from ray_wandb_nodes.report.summary import summarise

    return summarise("r", "/x", list(logs))


def test_a_node_far_below_the_others_is_flagged_and_only_that_node() -> None:
    report = report_of(*(synthetic(f"n{i}", 95.0) for i in range(4)), synthetic("slow", 40.0))
    flags = {n.label: n.flags for n in report.nodes}
    assert flags.pop("slow") == ["GPU utilisation 40.0% vs 95.0% (median of the other 4 nodes)"]
    assert all(f == [] for f in flags.values())
    slow = next(n for n in report.nodes if n.label == "slow")
    assert [(g.index, g.util_mean, g.mem_mean) for g in slow.gpus] == [(0, 40.0, 70.0), (1, 40.0, None)]
    assert slow.net_sent_bps == pytest.approx(1e6) and slow.net_recv_bps == pytest.approx(2e6)


def test_small_differences_and_two_node_runs_are_not_flagged() -> None:
    close = report_of(synthetic("a", 95.0), synthetic("b", 90.0), synthetic("c", 80.0, cpu=60.0))
    assert all(n.flags == [] for n in close.nodes)
    two = report_of(synthetic("a", 95.0), synthetic("b", 10.0))
    assert all(n.flags == [] for n in two.nodes) and "3 or more" in two.notes[0]


def test_only_nodes_with_workers_are_compared_when_the_index_says_which() -> None:
    nodes = [NodeSummary(label=f"w{i}", role=Role.NODE, samples=5, cpu_mean=90.0, workers=True) for i in range(3)]
    nodes.append(NodeSummary(label="head", role=Role.PRIMARY, samples=5, cpu_mean=2.0, workers=False))
    report = RunReport(run_id="r", folder="/x", nodes=nodes)
    flag(report)
    assert all(n.flags == [] for n in report.nodes)


def test_the_note_on_flagging_counts_the_nodes_it_compares() -> None:
    from ray_wandb_nodes.report.render import format_text

    def node(label: str, role: str, workers: bool | None) -> NodeSummary:
        return NodeSummary(label=label, role=Role(role), samples=5, cpu_mean=50.0, workers=workers)

    known = RunReport(run_id="r", folder="/x", nodes=[node("head", "primary", False), node("a", "node", True),
                                                      node("b", "node", True)])  # fmt: skip
    flag(known)
    assert known.notes == ["this run has 2 nodes with train workers: outliers are flagged among 3 or more"]
    text = format_text([known])
    assert sum(line.startswith(("  head ", "  a ", "  b ")) for line in text.splitlines()) == 3
    assert "  (this run has 2 nodes with train workers: outliers are flagged among 3 or more)" in text
    unknown = RunReport(run_id="r", folder="/x", nodes=[node("a", "node", None), node("b", "node", None)])
    flag(unknown)
    assert unknown.notes == ["this run has 2 nodes: outliers are flagged among 3 or more"]


def test_the_report_lists_a_logged_table_as_one_key(tmp_path: Path) -> None:
    """The real client writes a table's reference as nested keys (nodes/_type, nodes/path, ...):
    the report lists the key that was logged, ``nodes``, beside ``nodes/stragglers``."""
    import wandb

    from ray_wandb_nodes.report.render import format_text
    from ray_wandb_nodes.report.summary import summarise

    rows: list[dict[str, Any]] = [
        {"loss": 0.5, "epoch": 0, "opt": {"lr": 0.1}},
        {"nodes/stragglers": 0, "nodes": wandb.Table(columns=["node"], data=[["a"]]),
         "gpus": wandb.Table(columns=["gpu"], data=[[0]])},
    ]  # fmt: skip
    log = read_run(str(write_offline_run(tmp_path, unique("keys"), "node-primary-aaaaaa", rows)))
    assert {k for k in log.keys if not k.startswith("_")} == {
        "epoch",
        "gpus",
        "loss",
        "nodes",
        "nodes/stragglers",
        "opt/lr",
    }
    assert any(row.get("nodes/_type") == "table-file" for row in log.history)  # the rows keep the reference
    text = format_text([summarise("r", str(tmp_path), [log])])
    assert "  history 1 rows: epoch, gpus, loss, nodes, nodes/stragglers, opt/lr\n" in text


# the command line ------------------------------------------------------------------------------
def test_the_report_prints_the_alerts_the_run_raised() -> None:
    from ray_wandb_nodes.report.render import format_text
    from ray_wandb_nodes.report.summary import summarise

    alert = {"time": 1_800_000_000.0, "level": "WARN", "title": "Straggler: n1", "text": "n1 (rank 1) is a straggler"}
    report = summarise("r", "/x", [synthetic("n0", 95.0), synthetic("n1", 95.0)], {"run_id": "r", "alerts": [alert]})
    assert report.alerts == [alert]
    text = format_text([report])
    assert "Alerts raised during the run:" in text
    assert "WARN  Straggler: n1: n1 (rank 1) is a straggler" in text
    assert "Alerts raised during the run: none" in format_text([report_of(synthetic("n0", 95.0))])


def test_the_report_prints_the_last_ranks_table_the_run_logged() -> None:
    from ray_wandb_nodes._health import RANK_COLUMNS
    from ray_wandb_nodes.report.render import format_text, to_json
    from ray_wandb_nodes.report.summary import summarise

    rows = [
        [0, "node-a-1", None, 223, 172.72, 61.06, 6.55, 108.62, 0.11, 0.0, -2.38, "ok"],
        [1, "node-b-2", 3, 223, 172.86, 62.23, 104.42, 6.42, 0.14, None, 101.09, "slow"],
        ["(510 more ranks, none slow)", *[None] * (len(RANK_COLUMNS) - 1)],
    ]
    index = {"run_id": "r", "ranks": {"time": 1_800_000_000.0, "columns": RANK_COLUMNS, "rows": rows}}
    report = summarise("r", "/x", [synthetic("n0", 95.0), synthetic("n1", 95.0)], index)
    assert [row["state"] for row in report.ranks] == ["ok", "slow", None]
    assert to_json([report])["runs"][0]["ranks"][1]["compute_ms"] == 104.42
    text = format_text([report])
    lines = text.splitlines()
    at = lines.index("  Ranks (the last table logged, ms a step):")
    assert lines[at + 1].split() == "rank node gpu steps step input compute wait optim other late state".split()
    assert lines[at + 2].split() == "0 node-a-1 - 223 172.7 61.1 6.5 108.6 0.1 0.0 -2.4 ok".split()
    assert lines[at + 3].split() == "1 node-b-2 3 223 172.9 62.2 104.4 6.4 0.1 - 101.1 slow".split()
    assert lines[at + 4].strip() == "(510 more ranks, none slow)"
    assert max(len(line) for line in lines) <= 100
    assert "Ranks (" not in format_text([report_of(synthetic("n0", 95.0))])  # a run without: no section


def test_cli_errors_name_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "missing' is not a folder" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no W&B runs in" in capsys.readouterr().err


def test_report_text_json_and_png(
    offline_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "nodes.png"
    assert cli.main(["report", str(offline_run["folder"]), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    paths = (str(offline_run["folder"]), str(png))
    report_lines = [line for line in out.splitlines() if not any(p in line for p in paths)]
    assert all(len(line) <= 100 for line in report_lines), out
    assert f"Run {offline_run['run_id']}" in out and "history 5 rows" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert cli.main(["report", str(offline_run["folder"]), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert {n["label"]: n["role"] for n in run["nodes"]} == {
        "node-primary-aaaaaa": "primary",
        "node-w1-bbbbbb": "node",
        "node-w2-cccccc": "node",
    }
    for n in run["nodes"]:
        log = read_run(str(offline_run["files"][n["label"]]))
        memory = [v["memory_percent"] for _, v in log.stats[n["label"]] if "memory_percent" in v]
        assert n["samples"] == len(log.stats[n["label"]])
        assert n["mem_mean"] == pytest.approx(sum(memory) / len(memory)) and n["mem_max"] == max(memory)


@pytest.mark.parametrize(
    ("row", "health"),
    [
        ({"loss": 0.5, "training_iteration": 3}, False),
        ({"nodes/_type": "table-file", "nodes/stragglers": 0, "training_iteration": 3}, True),
        ({"ranks/_type": "table-file", "ranks/path": "media/table/ranks.json", "training_iteration": 40}, True),
        ({"ranks/slow": 1.0, "ranks/lateness_ms": 12.0, "training_iteration": 7}, True),
        ({"hangs/_type": "table-file", "training_iteration": 9}, True),
        ({"rank_1/loss": 0.5, "training_iteration": 3}, False),  # rank_metrics="all": a report
    ],
    ids=["report", "nodes", "ranks table", "slow-rank keys", "hangs", "a rank's report"],
)
def test_the_plugins_own_rows_are_not_counted_as_reports(row: dict[str, Any], health: bool) -> None:
    """The offline report's history rows are the reports: the node, ranks and hangs tables' rows
    (their references flattened by the transaction log) are not."""
    from ray_wandb_nodes.report.summary import _is_health_row

    assert _is_health_row(row) is health
