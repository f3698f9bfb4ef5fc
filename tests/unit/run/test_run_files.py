"""The files a failed attempt and a hang keep in their run (``_run.run_files``): written under the
run's folder, saved into the run now when online, left for ``sync`` offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._run.run_files import save_run_files


class Run:
    def __init__(self, folder: Path) -> None:
        self.dir = str(folder)
        self.saved: list[tuple[str, str, str]] = []

    def save(self, path: str, base_path: str, policy: str) -> None:
        self.saved.append((str(Path(path).relative_to(base_path)), base_path, policy))


FILES = [("traceback-rank-1.txt", "ValueError: bad shard 17\n"), ("stacks/rank-0.txt", "Thread 1 ...\n")]


def test_online_each_file_is_written_under_its_folder_and_saved_now(tmp_path: Path) -> None:
    run = Run(tmp_path)
    save_run_files(run, "failures/attempt-1", FILES, offline=False)
    assert (tmp_path / "failures/attempt-1/traceback-rank-1.txt").read_text() == "ValueError: bad shard 17\n"
    assert (tmp_path / "failures/attempt-1/stacks/rank-0.txt").read_text() == "Thread 1 ...\n"
    assert run.saved == [
        ("failures/attempt-1/traceback-rank-1.txt", str(tmp_path), "now"),
        ("failures/attempt-1/stacks/rank-0.txt", str(tmp_path), "now"),
    ]


def test_offline_the_files_stay_in_the_run_folder_for_sync(tmp_path: Path) -> None:
    run = Run(tmp_path)
    save_run_files(run, "hangs/hang-1", FILES, offline=True)
    assert (tmp_path / "hangs/hang-1/stacks/rank-0.txt").exists() and run.saved == []


def test_what_cannot_be_written_raises_for_the_caller_to_warn(tmp_path: Path) -> None:
    (tmp_path / "hangs").write_text("a file where the folder goes")
    run: Any = Run(tmp_path)
    with pytest.raises(OSError):
        save_run_files(run, "hangs/hang-1", FILES, offline=False)
    assert run.saved == []
