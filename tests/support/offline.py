"""What the offline tests share: a run folder that the real wandb client writes without Ray (a
primary with history and two labelled node writers of one run id, as the plugin writes them
offline), and copies of it for a test to change.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.runs import unique
from tests.support.wait import wait_until

WIDE_KEYS = 3000  # one history row larger than a 32 KiB block: FIRST, MIDDLE, LAST chunks


def write_offline_run(folder: Path, run_id: str, label: str, rows: list[dict[str, Any]]) -> Path:
    import wandb

    run = wandb.init(
        id=run_id,
        project="offline-tools",
        dir=str(folder),
        mode="offline",
        config={"lr": 0.1} if rows else None,
        reinit="create_new",
        settings=wandb.Settings(x_label=label, x_stats_sampling_interval=0.3, console="off"),
    )
    for row in rows:
        run.log(row)
        time.sleep(0.2)
    if not rows:  # a node writer: its ranks' console, as the node logger writes it (``_console.RunConsole``)
        run.write_logs(console_text(label))
    time.sleep(1.2)  # a few stats samples
    run.finish()
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    # finish() can return before wandb-core has written the log out (seen with a second offline
    # run in one process): wait, bounded, for its exit record.
    from ray_wandb_nodes._wandb.txlog import read_run

    wait_until(
        lambda: read_run(str(path), strict=False).exit_code is not None, 15, "the run's exit record", every_s=0.1
    )
    return path


def console_text(label: str) -> str:
    """What the node writer labelled ``label`` writes into the run's console (one rank's line)."""
    return f"[rank 1] printed on {label}"


_BUILT: list[dict[str, Any]] = []  # this session's offline_run


@pytest.fixture(scope="session")
def offline_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run folder: the primary's offline run and two node writers', with an index. Built once
    for every test file that uses it (a test reads it, or changes a copy: ``copy_folder``)."""
    if not _BUILT:
        _BUILT.append(_write_run_folder(tmp_path_factory))
    return _BUILT[0]


def _write_run_folder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("offline-run")
    run_id = unique("tools")
    rows: list[dict[str, Any]] = [{"loss": 1.0 / (i + 1), "epoch": i} for i in range(4)]
    rows.append({f"wide/{i:04d}": float(i) for i in range(WIDE_KEYS)})
    files = {
        "node-primary-aaaaaa": write_offline_run(base / "primary", run_id, "node-primary-aaaaaa", rows),
        "node-w1-bbbbbb": write_offline_run(base / "nodes" / "node-w1-bbbbbb", run_id, "node-w1-bbbbbb", []),
        "node-w2-cccccc": write_offline_run(base / "nodes" / "node-w2-cccccc", run_id, "node-w2-cccccc", []),
    }
    index = {
        "format": "ray_wandb_nodes.offline/1",
        "run_id": run_id,
        "project": "offline-tools",
        "exit_code": 0,
        "writers": [
            {
                "role": "primary" if label == "node-primary-aaaaaa" else "node",
                "label": label,
                "state": "collected",
                "path": os.path.relpath(path.parent, base),
            }
            for label, path in files.items()
        ],
    }
    (base / "index.json").write_text(json.dumps(index))
    return {"folder": base, "run_id": run_id, "rows": rows, "files": files}


def copy_folder(offline_run: dict[str, Any], tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(offline_run["folder"], dest, symlinks=True)
    return dest
