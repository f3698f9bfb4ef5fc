"""torch's flight-recorder dump read field by field (pure): what a hang's evidence and a step's waits share.

The dump is the JSON one (torch 2.13, ``_dump_fr_trace_json``): ``entries``, one a collective,
each with its ``process_group`` (name, description; older dumps: only ``pg_id``), its
``collective_seq_id`` and its ``profiling_name`` (``nccl:all_reduce``). ``_hang/flight.py``
builds the hang's typed records from it and ``_steps/flight.py`` the collectives' device
durations; both read a dump, and an entry's group, operation and sequence number, here.
"""

from __future__ import annotations

import json
from typing import Any


def load_dump(text: str) -> dict[str, Any]:
    """A dump's text as its JSON object; a ``ValueError`` for text that is not a recorder dump."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a flight-recorder dump: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"not a flight-recorder dump: a JSON {type(data).__name__}")
    return data


def as_int(value: Any, default: int = -1) -> int:
    """``value`` as an int; ``default`` where it is none."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def entry_group(entry: dict[str, Any]) -> tuple[str, str]:
    """An entry's process group: its name (the same on each of its ranks) and description ("" where none)."""
    pg = entry.get("process_group") or [entry.get("pg_id", "")]
    return str(pg[0]), str(pg[1]) if len(pg) > 1 else ""


def entry_op(entry: dict[str, Any]) -> str:
    """An entry's collective (``all_reduce``, ``broadcast``, ...): its profiling name less the backend."""
    return str(entry.get("profiling_name") or "?").rsplit(":", 1)[-1]


def entry_seq(entry: dict[str, Any]) -> int | None:
    """An entry's sequence number in its process group (the same on every rank of it); None where it has none."""
    value: Any = entry.get("collective_seq_id")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
