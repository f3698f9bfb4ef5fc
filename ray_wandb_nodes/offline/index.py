"""The run folder on the driver side and its ``index.json``: the run, its writers, labels and paths."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from typing import Any

INDEX = "index.json"
INDEX_FORMAT = "ray_wandb_nodes.offline/1"


def offline_folder(base: str, run_id: str) -> str:
    return os.path.join(base, "ray_wandb_nodes", run_id)


def node_local_dir(run_id: str, label: str) -> str:
    """Where a node writer of an offline run writes, on its node (the same path after a restart)."""
    return os.path.join(tempfile.gettempdir(), "ray_wandb_nodes", "offline", run_id, label)


def make_private_dir(path: str) -> None:
    """Create ``path`` readable by this user only (node temp folders are shared with others)."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def read_index(folder: str) -> dict[str, Any] | None:
    """``folder``'s ``index.json``, None when there is none; a ``ValueError`` that names the file
    when it cannot be read as JSON."""
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({e}); it should be the index of an offline run") from None
    return data


_INDEXES: dict[str, OfflineIndex] = {}
_INDEXES_LOCK = threading.Lock()


def open_index(folder: str, *, run_id: str, project: str | None, name: str | None, group: str | None) -> OfflineIndex:
    """The one index object of ``folder`` in this process (a restarted trial or a second fit of
    one run writes to the same folder); it starts from the index already on disk, if any."""
    key = os.path.realpath(folder)
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = _INDEXES[key] = OfflineIndex(folder, run_id=run_id, project=project, name=name, group=group)
        return index


class OfflineIndex:
    """``index.json`` of one offline run folder; written atomically after every change.

    Build it with :func:`open_index`, so that one object per folder writes the file.
    """

    def __init__(self, folder: str, *, run_id: str, project: str | None, name: str | None, group: str | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {
            "format": INDEX_FORMAT,
            "run_id": run_id,
            "project": project,
            "entity": None,
            "name": name,
            "group": group,
            "exit_code": None,
            "worker_nodes": [],
            "writers": [],
        }
        try:
            on_disk = read_index(folder) or {}
        except ValueError:
            on_disk = {}
        if on_disk.get("run_id") == run_id:
            self.data.update({k: v for k, v in on_disk.items() if k != "updated"})

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.data.update(fields)
            self._write()

    def set_writer(self, entry: dict[str, Any]) -> None:
        """Add or replace the entry of one writer (by label and role)."""
        with self._lock:
            writers = [
                w
                for w in self.data["writers"]
                if (w.get("label"), w.get("role")) != (entry.get("label"), entry.get("role"))
            ]
            writers.append(entry)
            writers.sort(key=lambda w: (w.get("role") != "primary", str(w.get("label"))))
            self.data["writers"] = writers
            self._write()

    def relative(self, path: str) -> str:
        return os.path.relpath(path, self.folder)

    def _write(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{INDEX}.", dir=self.folder)
        with os.fdopen(fd, "w") as f:
            json.dump({**self.data, "updated": time.time()}, f, indent=2, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(self.folder, INDEX))
