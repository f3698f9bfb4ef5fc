"""Ray's NCCL hang detector into the run (``_ray_hangs``): its real code (Ray 2.60) logs through
its own logger, and the relay turns each record into the run's alert, a confirmed hang's
uploaded diagnostics into the run's files; with ``RAY_TRAIN_NCCL_RAS_ACTION=fail`` (no message,
a raise) the files are found at the run's end."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._hang import HangNotice
from ray_wandb_nodes._health import Alert
from ray_wandb_nodes._run.ray_hangs import relay_ray_hangs, stop_relay
from ray_wandb_nodes._warn import Warner

nccl_ras = pytest.importorskip("ray.train.v2._internal.callbacks.nccl_ras", reason="Ray's detector is new in 2.60")
REPO = Path(__file__).resolve().parents[3]


class Primary:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []
        self.hangs: list[HangNotice] = []

    def alert(self, alert: Alert) -> None:
        self.alerts.append(alert)

    def hang(self, notice: HangNotice) -> None:
        self.hangs.append(notice)


def stuck_report() -> Any:
    out = subprocess.run([str(REPO / "tests/support/bin/ncclras"), "-f", "json"], capture_output=True, text=True)
    return nccl_ras.parse_ras_schema(out.stdout)


@pytest.fixture
def detector(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RAY_TRAIN_NCCL_RAS_MIN_POLL_INTERVAL_S", "1")
    monkeypatch.setenv("RAY_TRAIN_NCCL_RAS_CONFIRM_DURATION_S", "4")
    return nccl_ras.NCCLRASCallback()


def uploaded(root: Path) -> dict[str, Path]:
    """What the detector uploads under the experiment: the ncclras polls and every rank's stacks."""
    tools = {"nccl_ras": root / "hang_detector" / "nccl_ras", "stack_traces": root / "hang_detector" / "stack_traces"}
    for folder in tools.values():
        folder.mkdir(parents=True)
    (tools["nccl_ras"] / "ncclras_2026-12-04T12-00-00.json").write_text('{"communicators": []}')
    (tools["nccl_ras"] / "ncclras_report.txt").write_text("NCCL RAS (scripted)")
    (tools["stack_traces"] / "rank_0.log").write_text("Thread 1 (idle): train_loop")
    return tools


def test_the_detectors_suspicion_confirmation_and_resumption_become_alerts_and_files(
    detector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyarrow import fs

    tools = uploaded(tmp_path)
    monkeypatch.setattr(detector, "fetch_ras_human_report", lambda: "NCCL RAS (scripted)")
    monkeypatch.setattr(detector, "dump_ras_query_history", lambda human=None: str(tools["nccl_ras"]))
    monkeypatch.setattr(detector, "dump_workers_stack_traces", lambda: str(tools["stack_traces"]))
    primary = Primary()
    relay = relay_ray_hangs(primary, "node-a", (str(tmp_path), fs.LocalFileSystem()), Warner())
    try:
        report = stuck_report()
        detector.comm_deadlock_count = {"0xc0ffee": detector._suspicion_polls}
        detector.handle_suspected_hangs(report)  # Ray's own words, through Ray's logger
        detector.handle_confirmed_hangs(["0xc0ffee"], report)
        detector.log_recovered_comms(frozen_counts={})
    finally:
        stop_relay(relay, timeout=5)
    assert [(a.title, a.level, a.node) for a in primary.alerts] == [
        ("Ray NCCL hang detector: possible hang", "WARN", "node-a"),
        ("Ray NCCL hang detector: progress again", "INFO", "node-a"),
    ]
    assert "0xc0ffee" in primary.alerts[0].text and "0xc0ffee" in primary.alerts[1].text
    (notice,) = primary.hangs
    assert notice.title == "Ray NCCL hang detector: hang" and notice.level == "ERROR"
    assert notice.folder == "hangs/ray-nccl-1" and "1 of 1 communicators" in notice.text
    assert dict(notice.files) == {
        "nccl_ras/ncclras_2026-12-04T12-00-00.json": '{"communicators": []}',
        "nccl_ras/ncclras_report.txt": "NCCL RAS (scripted)",
        "stack_traces/rank_0.log": "Thread 1 (idle): train_loop",
    }
    assert relay not in logging.getLogger(nccl_ras.logger.name).handlers


def test_with_the_fail_action_the_diagnostics_are_found_at_the_runs_end(tmp_path: Path) -> None:
    from pyarrow import fs

    uploaded(tmp_path)  # uploaded, then NCCLHangError raised: no message names them
    primary = Primary()
    relay = relay_ray_hangs(primary, "node-a", (str(tmp_path), fs.LocalFileSystem()), Warner())
    stop_relay(relay, timeout=5)
    (notice,) = primary.hangs
    assert notice.folder == "hangs/ray-nccl-1" and "RAY_TRAIN_NCCL_RAS_ACTION=fail" in notice.text
    assert {name for name, _ in notice.files} == {
        "nccl_ras/ncclras_2026-12-04T12-00-00.json", "nccl_ras/ncclras_report.txt", "stack_traces/rank_0.log"
    }  # fmt: skip


def test_other_records_stay_in_rays_log_and_a_run_without_diagnostics_gets_nothing(tmp_path: Path) -> None:
    from pyarrow import fs

    primary = Primary()
    relay = relay_ray_hangs(primary, "node-a", (str(tmp_path), fs.LocalFileSystem()), Warner())
    logging.getLogger(nccl_ras.logger.name).info("`ncclras` poll produced no report (exit_1). Will retry next poll.")
    stop_relay(relay, timeout=5)
    assert primary.alerts == [] and primary.hangs == []


def test_a_detector_that_turns_itself_off_is_one_warning_naming_why(caplog: pytest.LogCaptureFixture) -> None:
    primary = Primary()
    relay = relay_ray_hangs(primary, "node-a", (None, None), Warner())
    with caplog.at_level(logging.WARNING, logger="ray_wandb_nodes"):
        logging.getLogger(nccl_ras.logger.name).warning(
            "`ncclras` %s. Disabling NCCL RAS hang detection for the rest of this run.", "binary 'ncclras' not found"
        )
        stop_relay(relay, timeout=5)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("ray_wandb_nodes")]
    assert len(said) == 1 and "Ray's NCCL hang detector is off for this run" in said[0] and "not found" in said[0]
    assert primary.alerts == [] and primary.hangs == []
