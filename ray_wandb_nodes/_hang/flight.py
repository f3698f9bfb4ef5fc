"""torch's flight recorder: the environment that arms it, the in-process dump, and the dump parsed
into typed collectives.

The recorder keeps a ring buffer of each process group's collectives. It must be armed by
environment before the process group exists (``TORCH_FR_BUFFER_SIZE`` on torch 2.8 and later, for
every backend; ``TORCH_NCCL_TRACE_BUFFER_SIZE``, NCCL only, before), so the worker group's
environment carries it. The dump is the JSON one, which carries no stack traces (a dump with
them can deadlock on the GIL).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_BUFFER = 2000
_FR_SINCE = (2, 8)


@dataclass(frozen=True)
class Collective:
    """One collective of one process group as the recorder saw it on one rank."""

    seq: int  # the process group's collective sequence number (same on every rank of the group)
    op: str  # ``all_reduce``, ``broadcast``, ``barrier``, ...
    state: str  # ``completed``, or the recorder's state while in flight (``scheduled``, ``started``)
    pg: str  # the process group's name (``default_pg``) or id

    @property
    def in_flight(self) -> bool:
        return self.state != "completed"


@dataclass(frozen=True)
class PgStatus:
    """A process group's last collective sequence numbers on one rank (-1: none)."""

    pg: str
    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass(frozen=True)
class FlightRecord:
    """One rank's dump: its recent collectives (oldest first) and each group's status."""

    collectives: tuple[Collective, ...]
    groups: tuple[PgStatus, ...]

    def in_flight(self) -> list[Collective]:
        return [c for c in self.collectives if c.in_flight]

    def last_seq(self, pg: str) -> int:
        """The highest sequence number this rank enqueued in ``pg`` (-1: none)."""
        seqs = [c.seq for c in self.collectives if c.pg == pg] + [g.last_enqueued for g in self.groups if g.pg == pg]
        return max(seqs, default=-1)

    def trimmed(self) -> FlightRecord:
        """What the verdict and the run's files read: the collectives in flight and each group's
        newest one (so :meth:`in_flight` and :meth:`last_seq` are unchanged). The node trims
        before its answer crosses: a full ring of 2,000 collectives a group made 0.6 MB a node of
        8 ranks, and 262 MiB held by the driver at 64 nodes (``bench/hang_evidence.py``)."""
        newest: dict[str, Collective] = {}
        for c in self.collectives:
            if c.pg not in newest or c.seq > newest[c.pg].seq:
                newest[c.pg] = c
        keep = {id(c) for c in newest.values()}
        return FlightRecord(tuple(c for c in self.collectives if c.in_flight or id(c) in keep), self.groups)


def _version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def flight_recorder_env(
    buffer_size: int = DEFAULT_BUFFER, torch_version: str | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables that arm the flight recorder, for the worker group's environment.

    ``torch_version`` is the workers' torch (default: this process's, where installed); where it
    is unknown both names are set. A variable already in ``environ`` (the user's own) is kept."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
        raise ValueError(f"buffer_size must be an int > 0 (entries per process group), got {buffer_size!r}")
    if torch_version is None:
        try:
            import torch

            torch_version = str(torch.__version__)
        except ImportError:
            torch_version = None
    version = _version(torch_version) if torch_version else None
    if version is None:
        names = ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"]
    else:
        names = ["TORCH_FR_BUFFER_SIZE"] if version >= _FR_SINCE else ["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    environ = environ or {}
    return {name: str(buffer_size) for name in names if name not in environ}


def dump_flight_recorder() -> str | None:
    """This process's recorder as JSON text, without stack traces; None where torch, the dump
    function or an armed recorder is missing. Never imports torch: a process that has not
    imported it has no process group to record."""
    if "torch" not in sys.modules:
        return None
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    try:
        raw = dump(includeCollectives=True, onlyActive=False)
    except Exception:  # noqa: BLE001 - a recorder that cannot dump is no evidence, not a failure
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_flight_recorder(text: str) -> FlightRecord:
    """A dump's text as typed records; a ``ValueError`` for text that is not a recorder dump."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a flight-recorder dump: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"not a flight-recorder dump: a JSON {type(data).__name__}")
    groups = {}
    for pg_id, status in (data.get("pg_status") or {}).items():
        groups[str(pg_id)] = PgStatus(
            str(pg_id),
            _int(status.get("last_enqueued_collective")),
            _int(status.get("last_started_collective")),
            _int(status.get("last_completed_collective")),
        )
    collectives = []
    for entry in data.get("entries") or []:
        pg = entry.get("process_group") or [entry.get("pg_id", "")]
        pg_id = str(pg[0]) if pg else str(entry.get("pg_id", ""))
        seq = _int(entry.get("collective_seq_id"))
        status = groups.get(pg_id)
        done = bool(entry.get("retired")) or (status is not None and seq <= status.last_completed)
        state = "completed" if done or entry.get("state") == "completed" else str(entry.get("state") or "scheduled")
        op = str(entry.get("profiling_name") or "?").rsplit(":", 1)[-1]
        collectives.append(Collective(seq=seq, op=op, state=state, pg=pg_id))
    collectives.sort(key=lambda c: (c.pg, c.seq))
    return FlightRecord(tuple(collectives), tuple(groups[k] for k in sorted(groups)))


FLIGHT_TAIL = 8  # of each process group's completed collectives, the newest this many stay in a rank's file
_UNPARSED_MAX = 1 << 16  # of a dump that is not the recorder's JSON, this much stays (the node says why)


def trim_dump(text: str, tail: int = FLIGHT_TAIL) -> str:
    """A rank's dump as its evidence file keeps it (on the node's shared memory): every collective
    not completed and each process group's newest ``tail`` entries, in the dump's own format
    (:func:`parse_flight_recorder` reads it as it reads a full one, and every field of a kept
    entry stays). A full ring of 2,000 collectives a group is about 0.6 MB a rank; this is a few
    kB, whatever the ring's size."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text[:_UNPARSED_MAX]
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return text if len(text) <= _UNPARSED_MAX else text[:_UNPARSED_MAX]
    completed = {str(pg): _int(s.get("last_completed_collective")) for pg, s in (data.get("pg_status") or {}).items()}
    by_group: dict[str, list[tuple[int, int]]] = {}
    keep: set[int] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        pg = entry.get("process_group") or [entry.get("pg_id", "")]
        pg_id = str(pg[0]) if pg else str(entry.get("pg_id", ""))
        seq = _int(entry.get("collective_seq_id"))
        finished = pg_id in completed and seq <= completed[pg_id]
        done = bool(entry.get("retired")) or entry.get("state") == "completed" or finished
        if not done:
            keep.add(i)
        by_group.setdefault(pg_id, []).append((seq, i))
    for seqs in by_group.values():
        keep.update(i for _, i in sorted(seqs)[-tail:])
    data["entries"] = [entry for i, entry in enumerate(entries) if i in keep]
    return json.dumps(data)
