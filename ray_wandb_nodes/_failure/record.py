"""A rank's own record of how it ended, written where its Python can still act, beside its hang
beacon (``rank-<rank>.<pid>.failure.json`` in the run's folder on its node), so that the node's
logger reads it even when Ray's controller only saw the cascade, or saw nothing yet.

- :meth:`RankRecorder.raised`: the train function's exception, as it leaves the function
  (Ray's training thread hands it over, see ``_ray.failures.hook_train_errors``): its type and
  message, its traceback, its causes, the innermost frame of the user's code and the moment, on
  this node's monotonic clock (the beacon's). Written once, at failure: nothing on the hot path.
- :meth:`RankRecorder.present`: an empty mark ``rank-<rank>.<pid>.rank``, written once when the
  rank is set up, so that the node's logger knows the rank's process (and sees it end) whether
  hang detection gave the rank a beacon or not.
- :meth:`RankRecorder.stopped`: Ray asked the worker to shut down (its orderly stop after a
  decision: ``_ray.add_shutdown_hook``), so a process that is gone afterwards was stopped, not
  killed; with where its training thread stood then (its stack), taken before Ray kills it.

Every record carries the rank's position in each of its process groups (:func:`group_positions`:
the sequence number of the last collective the group issued on this rank, as torch counts them
for gloo and NCCL alike), so that the ranks behind a collective timeout are told from the rank
they waited for by numbers, not by words.

Its texts (message, traceback, causes) are masked (``_mask``) before they are written: the
record leaves the node. A process killed outright (SIGKILL, the kernel's OOM killer) writes nothing: its absence, with
the process gone, is the node's evidence (``node``). Recording never raises and never keeps the
exception: the caller hands it on untouched.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._mask import mask
from .._ray.failures import type_name
from .facts import UserFrame
from .texts import innermost_user_frame

RAISED_SUFFIX, STOPPED_SUFFIX, PRESENT_SUFFIX = ".failure.json", ".stopped.json", ".rank"
MAX_TRACEBACK = 256 * 1024  # characters of a traceback kept (its head and its tail past that)
MAX_MESSAGE = 4000
MAX_CAUSES = 8
MAX_GROUPS = 64  # process groups whose positions a record keeps
MAX_STACK = 64 * 1024  # characters of a stopped rank's stack kept


class RecordKind(enum.Enum):
    RAISED = "raised"  # the train function raised
    STOPPED = "stopped"  # Ray asked the worker to shut down


@dataclass(frozen=True)
class RankRecord:
    """What a rank wrote of its end (``to_json``/``from_json`` cross the process boundary)."""

    rank: int
    pid: int
    kind: RecordKind
    mono_ns: int  # this node's CLOCK_MONOTONIC: comparable with its other ranks' and its beacons'
    wall: float  # epoch seconds, for people: never compared across hosts
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    frame: UserFrame | None = None
    causes: tuple[str, ...] = ()  # "Type: message" of each cause, the nearest first
    thread: str = ""
    # (process group's name, sequence number of its last collective on this rank): "0" is the
    # default group (torch's own names); empty where torch.distributed was not set up
    groups: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = self.kind.value
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> RankRecord:
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a rank's record is a JSON object, not {type(data).__name__}")
        frame = data.get("frame")
        return cls(
            rank=int(data["rank"]),
            pid=int(data["pid"]),
            kind=RecordKind(data["kind"]),
            mono_ns=int(data["mono_ns"]),
            wall=float(data["wall"]),
            error_type=str(data.get("error_type", "")),
            message=str(data.get("message", "")),
            traceback=str(data.get("traceback", "")),
            frame=UserFrame(**frame) if isinstance(frame, dict) else None,
            causes=tuple(str(c) for c in data.get("causes", ())),
            thread=str(data.get("thread", "")),
            groups=tuple((str(g), int(n)) for g, n in data.get("groups", ())),
        )


def record_of(rank: int, exc: BaseException, kind: RecordKind = RecordKind.RAISED) -> RankRecord:
    """The record of ``exc`` as this process sees it now."""
    summary = traceback.extract_tb(exc.__traceback__)
    frames = [UserFrame(f.filename, f.lineno, f.name, (f.line or "").strip()) for f in summary]
    text = mask("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    if len(text) > MAX_TRACEBACK:
        half = MAX_TRACEBACK // 2
        text = f"{text[:half]}\n... ({len(text) - MAX_TRACEBACK} characters left out) ...\n{text[-half:]}"
    return RankRecord(
        rank=rank,
        pid=os.getpid(),
        kind=kind,
        mono_ns=time.monotonic_ns(),
        wall=time.time(),
        error_type=type_name(exc),
        message=_bounded(mask(_message(exc))),
        traceback=text,
        frame=innermost_user_frame(frames),
        causes=tuple(f"{type_name(c)}: {_bounded(mask(_message(c)), 500)}" for c in _causes(exc)),
        thread=threading.current_thread().name,
        groups=group_positions() or _remembered,
    )


_remembered: tuple[tuple[str, int], ...] = ()  # the positions as the default group ended (see remember_positions)


def remember_positions() -> tuple[tuple[str, int], ...]:
    """Keep this process's positions now, as its default group is about to go: a raise after
    that (a ``finally: dist.destroy_process_group()`` runs before the exception leaves the train
    function) still records where the rank stood."""
    global _remembered
    _remembered = group_positions() or _remembered
    return _remembered


def group_positions() -> tuple[tuple[str, int], ...]:
    """Each process group of this process with the sequence number of the last collective it
    issued here (``ProcessGroup._get_sequence_number_for_group``: gloo and NCCL, torch 2.4 to
    2.13; torch's ``_world.pg_names`` name them, ``"0"`` the default group). Read only where the
    process imported torch.distributed already; () where it did not, or anything fails."""
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return ()
    try:
        world = c10d._world
        out = []
        for pg, name in list(world.pg_names.items())[:MAX_GROUPS]:
            out.append((str(name), int(pg._get_sequence_number_for_group())))
        return tuple(out)
    except Exception:  # noqa: BLE001 - a torch without these names: no positions
        return ()


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises
        return f"<{type(exc).__name__}: its message could not be read>"


def _bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen = {id(exc)}
    current: BaseException | None = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen and len(out) < MAX_CAUSES:
        out.append(current)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return out


class RankRecorder:
    """One rank's recorder: writes its records into ``directory`` (the run's beacon folder on this
    node). Every method swallows its own failures: a record is never worth a changed error."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.directory = Path(directory)
        self.rank = rank

    def path(self, suffix: str, pid: int | None = None) -> Path:
        return self.directory / f"rank-{self.rank}.{os.getpid() if pid is None else pid}{suffix}"

    def raised(self, exc: BaseException) -> bool:
        """Record ``exc``, the exception leaving the train function; whether it was written."""
        try:
            write_atomic(self.path(RAISED_SUFFIX), record_of(self.rank, exc).to_json())
            return True
        except Exception:  # noqa: BLE001 - never in the way of the user's exception
            return False

    def present(self) -> bool:
        """Mark this process as the rank's (see the module's docstring); whether it was written."""
        try:
            self.path(PRESENT_SUFFIX).touch(mode=0o600, exist_ok=True)
            return True
        except Exception:  # noqa: BLE001
            return False

    def stopped(self, frames: Sequence[traceback.FrameSummary] = ()) -> bool:
        """Record that Ray is stopping this worker (its shutdown call), with ``frames``, where its
        training thread stood then (outermost first); whether it was written."""
        try:
            stack = "".join(traceback.format_list(list(frames)))
            if len(stack) > MAX_STACK:
                stack = "...\n" + stack[-MAX_STACK:]
            user = [UserFrame(f.filename, f.lineno, f.name, (f.line or "").strip()) for f in frames]
            record = RankRecord(self.rank, os.getpid(), RecordKind.STOPPED, time.monotonic_ns(), time.time(),
                                traceback=stack, frame=innermost_user_frame(user) if user else None,
                                groups=group_positions() or _remembered)  # fmt: skip
            write_atomic(self.path(STOPPED_SUFFIX), record.to_json())
            return True
        except Exception:  # noqa: BLE001
            return False


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader never sees half a record)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def new_records(directory: Path, seen: set[str]) -> list[RankRecord]:
    """The records in ``directory`` whose file names are not in ``seen`` (read once each: a
    traceback may be large); their names are added to ``seen``. A torn or unreadable file is left
    for the next look."""
    out = []
    for suffix in (RAISED_SUFFIX, STOPPED_SUFFIX):
        for path in Path(directory).glob(f"rank-*{suffix}"):
            if path.name in seen:
                continue
            try:
                out.append(RankRecord.from_json(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            seen.add(path.name)
    return sorted(out, key=lambda r: (r.rank, r.mono_ns))


def read_records(directory: Path) -> list[RankRecord]:
    """Every rank's record in ``directory`` (unreadable or torn files left out), by rank."""
    out = []
    for suffix in (RAISED_SUFFIX, STOPPED_SUFFIX):
        for path in Path(directory).glob(f"rank-*{suffix}"):
            try:
                out.append(RankRecord.from_json(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return sorted(out, key=lambda r: (r.rank, r.mono_ns))
