"""Names that must be stable: node labels and run ids (pure functions)."""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# W&B run ids: letters, digits, '-', '_' and '.'; keep them well under the 128-character limit.
_RUN_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


def node_label(hostname: str | None, node_id: str) -> str:
    """``node-<hostname>-<first 6 of NodeID>``: readable, and unique even where nodes share a host."""
    host = _UNSAFE.sub("-", hostname or "").strip("-.") or "host"
    return f"node-{host[:40]}-{node_id[:6]}"


def train_run_id(storage_path: str, run_name: str) -> str:
    """The W&B run id of a Train run: the same for every restart and auto-resume of that run.

    Ray keeps ``storage_path`` and the run name across restarts (auto-resume goes by name),
    so the id is derived from both: readable prefix from the name, hash of the pair.
    """
    digest = hashlib.sha256(f"{storage_path.rstrip('/')}/{run_name}".encode()).hexdigest()[:12]
    slug = _RUN_ID_SAFE.sub("-", run_name).strip("-")[:40] or "run"
    return f"{slug}-{digest}"
