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

from .._flight import as_int, entry_group, entry_op, load_dump

DEFAULT_BUFFER = 2000
_FR_SINCE = (2, 8)


@dataclass(frozen=True)
class Collective:
    """One collective of one process group as the recorder saw it on one rank."""

    seq: int  # the process group's collective sequence number (same on every rank of the group)
    op: str  # ``all_reduce``, ``broadcast``, ``barrier``, ...
    state: str  # ``completed``, or the recorder's state while in flight (``scheduled``, ``started``)
    pg: str  # the process group's name, the same on each of its ranks (``0``: the default group)
    record: int = -1  # the recorder's id of the entry: the order of this rank's collectives across groups
    p2p: bool = False  # a send or recv: ``seq`` is then the group's last collective's, not its own

    @property
    def in_flight(self) -> bool:
        return self.state != "completed"


@dataclass(frozen=True)
class PgStatus:
    """A process group this rank is in, with its last collective sequence numbers here (-1: none)."""

    pg: str  # its name, as :attr:`Collective.pg`
    last_enqueued: int
    last_started: int
    last_completed: int
    desc: str = ""  # torch's description (``default_pg``, ``mesh_tp``, the user's ``group_desc``)
    ranks: tuple[int, ...] = ()  # its global ranks where the recorder has them (NCCL; gloo leaves them out)


@dataclass(frozen=True)
class FlightRecord:
    """One rank's dump: its recent collectives (oldest first) and each group's status."""

    collectives: tuple[Collective, ...]
    groups: tuple[PgStatus, ...]

    def in_flight(self) -> list[Collective]:
        return [c for c in self.collectives if c.in_flight]

    def pending(self) -> list[Collective]:
        """The collective each group is stuck in on this rank: its oldest not completed (with
        NCCL a rank enqueues more behind it, and the newest is not the one that waits), the
        oldest group's first. Sends and receives are left out: their numbers are not the group's."""
        oldest: dict[str, Collective] = {}
        for c in self.collectives:
            if c.in_flight and not c.p2p and (c.pg not in oldest or c.seq < oldest[c.pg].seq):
                oldest[c.pg] = c
        return sorted(oldest.values(), key=lambda c: (c.record, c.seq))

    def group(self, pg: str) -> PgStatus | None:
        return next((g for g in self.groups if g.pg == pg), None)

    def knows(self, pg: str) -> bool:
        """Whether this rank is in ``pg`` as far as its recorder tells (a collective, a status)."""
        return self.group(pg) is not None or any(c.pg == pg for c in self.collectives)

    def last_seq(self, pg: str) -> int:
        """The highest sequence number this rank enqueued in ``pg`` (-1: none)."""
        seqs = [c.seq for c in self.collectives if c.pg == pg and not c.p2p]
        seqs += [g.last_enqueued for g in self.groups if g.pg == pg]
        return max(seqs, default=-1)

    def last_completed(self, pg: str) -> int:
        """The highest sequence number of ``pg`` completed on this rank (-1: none). A collective
        completes on a rank only once every rank of its group entered it."""
        seqs = [c.seq for c in self.collectives if c.pg == pg and not c.p2p and not c.in_flight]
        seqs += [g.last_completed for g in self.groups if g.pg == pg]
        return max(seqs, default=-1)

    def trimmed(self) -> FlightRecord:
        """What the verdict and the run's files read: the collectives in flight and each group's
        newest one (so :meth:`in_flight`, :meth:`pending`, :meth:`knows` and :meth:`last_seq` are
        unchanged; :meth:`last_completed` then rests on the group's status). The node trims
        before its answer crosses: a full ring of 2,000 collectives a group made 0.6 MB a node
        of 8 ranks, and 262 MiB held by the driver at 64 nodes (``bench/hang_evidence.py``)."""
        newest: dict[str, Collective] = {}
        for c in self.collectives:  # of a send and a collective at one number, the collective
            if c.pg not in newest or (c.seq, not c.p2p) > (newest[c.pg].seq, not newest[c.pg].p2p):
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

    ``torch_version`` is the workers' torch (default: this process's, where installed, found
    without importing it); where it is unknown both names are set. A variable already in
    ``environ`` (the user's own) is kept."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
        raise ValueError(f"buffer_size must be an int > 0 (entries per process group), got {buffer_size!r}")
    if torch_version is None:
        torch_version = installed_torch()
    version = _version(torch_version) if torch_version else None
    if version is None:
        names = ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"]
    else:
        names = ["TORCH_FR_BUFFER_SIZE"] if version >= _FR_SINCE else ["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    environ = environ or {}
    return {name: str(buffer_size) for name in names if name not in environ}


def installed_torch() -> str | None:
    """This process's torch version without importing torch (a worker of XGBoost or JAX that
    has torch installed must not load it: seconds and hundreds of MB): the imported module's
    where it is imported, else the installed distribution's; None where neither is found."""
    module = sys.modules.get("torch")
    if module is not None:
        return str(getattr(module, "__version__", "")) or None
    from importlib import metadata

    try:
        return metadata.version("torch")
    except (metadata.PackageNotFoundError, ValueError):
        return None


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


def _ranks(text: Any) -> tuple[int, ...]:
    """``"[0, 1, 2]"`` (pg_config's form) as ranks; () for anything else."""
    if isinstance(text, list):
        values: Any = text
    else:
        try:
            values = json.loads(str(text))
        except json.JSONDecodeError:
            return ()
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return ()
    return tuple(values)


def parse_flight_recorder(text: str) -> FlightRecord:
    """A dump's text as typed records; a ``ValueError`` for text that is not a recorder dump.

    A group is known by its name, which every rank of it shares: an entry's ``process_group``
    is (name, description). ``pg_status`` is keyed by the recorder's own id of the group in this
    process (``pg_id``), which differs from rank to rank: with ``pair_0_1`` and ``pair_2_3``
    created in that order, both are ``pg_id`` 1 on their ranks, named ``1`` and ``2``. The
    entries map one to the other; a status whose group has no entry left in the ring is dropped.
    ``pg_config`` gives each group's ranks where the backend records them (NCCL; gloo, torch 2.13,
    records one group named ``""``, left out)."""
    data = load_dump(text)
    names: dict[str, tuple[str, str]] = {}  # the recorder's pg_id -> (name, description)
    raw = []
    for entry in data.get("entries") or []:
        name, desc = entry_group(entry)
        names.setdefault(str(entry.get("pg_id", name)), (name, desc))
        raw.append((entry, name))
    config: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, info in (data.get("pg_config") or {}).items():
        if key and isinstance(info, dict) and _ranks(info.get("ranks")):
            config[str(key)] = (str(info.get("desc") or ""), _ranks(info.get("ranks")))
    groups: dict[str, PgStatus] = {}
    for pg_id, status in (data.get("pg_status") or {}).items():
        if str(pg_id) not in names:
            continue
        name, desc = names[str(pg_id)]
        groups[name] = PgStatus(
            name,
            as_int(status.get("last_enqueued_collective")),
            as_int(status.get("last_started_collective")),
            as_int(status.get("last_completed_collective")),
            desc,
            config.get(name, ("", ()))[1],
        )
    for name, (desc, ranks) in config.items():  # a group of this rank's with no collective yet
        groups.setdefault(name, PgStatus(name, -1, -1, -1, desc, ranks))
    collectives = []
    for entry, name in raw:
        seq = as_int(entry.get("collective_seq_id"))
        p2p = bool(entry.get("is_p2p"))
        status = groups.get(name)
        # gloo leaves ``state`` at ``scheduled`` and marks a completed entry ``retired``; its
        # status's last completed can lag one behind
        done = bool(entry.get("retired")) or (not p2p and status is not None and seq <= status.last_completed)
        state = "completed" if done or entry.get("state") == "completed" else str(entry.get("state") or "scheduled")
        collectives.append(Collective(seq, entry_op(entry), state, name, as_int(entry.get("record_id")), p2p))
    collectives.sort(key=lambda c: (c.pg, c.seq, c.record))
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
    completed = {str(pg): as_int(s.get("last_completed_collective")) for pg, s in (data.get("pg_status") or {}).items()}
    by_group: dict[str, list[tuple[int, int]]] = {}
    keep: set[int] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        pg_id = entry_group(entry)[0]
        seq = as_int(entry.get("collective_seq_id"))
        finished = pg_id in completed and seq <= completed[pg_id]
        done = bool(entry.get("retired")) or entry.get("state") == "completed" or finished
        if not done:
            keep.add(i)
        by_group.setdefault(pg_id, []).append((seq, i))
    for seqs in by_group.values():
        keep.update(i for _, i in sorted(seqs)[-tail:])
    data["entries"] = [entry for i, entry in enumerate(entries) if i in keep]
    return json.dumps(data)
