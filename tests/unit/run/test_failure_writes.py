"""A failed attempt as the primary writes it offline (``_run.failure_writes``): its files in the
run's folder (wandb's folder syncs them; nothing is uploaded now), the summary's ``failure``
fields, and every attempt in the run folder's index, a recovery marking its attempt recovered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray_wandb_nodes._failure import FailureNotice, FailureSummary, recovered_notice
from ray_wandb_nodes._run.failure_writes import failure_alert, save_failure
from ray_wandb_nodes._run.primary_index import PrimaryIndex
from ray_wandb_nodes._warn import Warner
from ray_wandb_nodes.offline.index import OfflineIndex


class OfflineRun:
    def __init__(self, folder: Path) -> None:
        self.dir = str(folder)
        self.summary: dict[str, Any] = {}
        self.saved: list[str] = []

    def save(self, path: str, base_path: str, policy: str) -> None:
        self.saved.append(path)


def test_each_attempt_offline_its_files_summary_and_index_entry(tmp_path: Path) -> None:
    index = OfflineIndex(str(tmp_path / "index"), run_id="r", project="p", name="n", group=None)
    run = OfflineRun(tmp_path / "files")
    summary = FailureSummary(1, "raised", "ValueError: bad shard 17", 1, "node-a", where="train.py:59 in load_shard")
    failed = FailureNotice(1, "Attempt 1: Rank 1 failed: ValueError: bad shard 17", "Rank 1 ...", "ERROR", summary,
                           files=(("rank-1.txt", "Traceback ...\n"),))  # fmt: skip
    save_failure(run, failed, Warner(), PrimaryIndex(index, Warner()))
    assert (tmp_path / "files" / "failures" / "attempt-1" / "rank-1.txt").read_text() == "Traceback ...\n"
    assert run.saved == [] and run.summary["failure"]["cause"] == "ValueError: bad shard 17"
    assert [f["attempt"] for f in index.data["failures"]] == [1] and not index.data["failures"][0]["recovered"]

    recovered = recovered_notice(2, summary)
    save_failure(run, recovered, Warner(), PrimaryIndex(index, Warner()))
    assert [(f["attempt"], f["recovered"]) for f in index.data["failures"]] == [(1, True)]
    assert failure_alert(recovered, "head").level == "INFO" and failure_alert(failed, "head").node == "node-a"
