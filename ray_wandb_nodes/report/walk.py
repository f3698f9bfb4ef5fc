"""Finding W&B runs in a folder, and who wrote each transaction log in it.

A folder is an offline run folder (with its ``index.json``), a folder of such folders, or
any folder of ``.wandb`` files. A file's writer (its run, role and labels) comes from the
index when the index names the file, else from the file itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .._wandb.txlog import RunLog
from .._wandb.writers import Role
from ..offline.index import INDEX, read_index


def find_run_folders(folder: str) -> list[tuple[str, dict[str, Any] | None]]:
    """``(run folder, index or None)`` for every run in ``folder``."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder!r} is not a folder; give an offline run folder (one holding {INDEX})")
    index = read_index(folder)
    if index is not None:
        return [(folder, index)]
    nested = sorted(os.path.join(root, INDEX) for root, _, names in os.walk(folder) if INDEX in names)
    if nested:
        return [(os.path.dirname(p), read_index(os.path.dirname(p))) for p in nested]
    if wandb_files(folder):
        return [(folder, None)]
    raise FileNotFoundError(
        f"no W&B runs in {folder!r}: it holds neither {INDEX} nor any .wandb file "
        "(offline runs of ray_wandb_nodes are in <dir>/ray_wandb_nodes/<run id>)"
    )


def wandb_files(folder: str) -> list[str]:
    """The ``.wandb`` files under ``folder``, not following links (wandb's ``latest-run`` is one)."""
    out: list[str] = []
    for root, _, names in os.walk(folder):
        out.extend(os.path.join(root, n) for n in names if n.endswith(".wandb"))
    return sorted(out)


def writer_for(path: str, folder: str, index: dict[str, Any] | None) -> dict[str, Any] | None:
    for w in (index or {}).get("writers", []):
        if w.get("path") and os.path.abspath(path).startswith(
            os.path.abspath(os.path.join(folder, w["path"])) + os.sep
        ):
            return dict(w)
    return None


@dataclass
class Writer:
    """Who wrote one transaction log: its run, role and labels, and its index entry if any."""

    run_id: str
    role: Role  # PRIMARY, NODE or RUN
    labels: list[str]  # as in the file's keys ("" for unlabelled keys)
    entry: dict[str, Any] | None


def identify(log: RunLog, folder: str, index: dict[str, Any] | None) -> Writer:
    """The writer of ``log`` (a file under ``folder``): from the index when it names the file,
    else from the file itself (a file with history or config is a primary's)."""
    entry = writer_for(log.path, folder, index)
    run_id = log.run_id or (index or {}).get("run_id") or "unknown"
    role = role_named((entry or {}).get("role"), Role.PRIMARY if log.history or log.config else Role.NODE)
    labels = log.labels or [(entry or {}).get("label") or os.path.basename(os.path.dirname(log.path))]
    return Writer(run_id=str(run_id), role=role, labels=labels, entry=entry)


def role_named(text: Any, otherwise: Role) -> Role:
    """The role an index entry names (its ``role``: the value of a :class:`Role`), else ``otherwise``."""
    return next((role for role in Role if role.value == text), otherwise)


def absent_writers(index: dict[str, Any] | None, present: set[str]) -> list[dict[str, Any]]:
    """The writers ``index`` names whose label has no file here (left on its node, lost, empty)."""
    return [w for w in (index or {}).get("writers", []) if (w.get("label") or "?") not in present]
