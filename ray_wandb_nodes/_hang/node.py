"""A node's side of hang detection, as its logger runs it: the attempt folders it watches (each
one's ranks read off their beacons, the files of their dead processes removed, the folder's lease
kept), every rank's evidence asked at once, and an end delivered only to the processes it names.

Watching a folder is apart from hosting a writer: a node watches the ranks a run placed there for
as long as the run's attempt lasts, whether its writer joined the run, failed to, or was swapped
for another (past the writer cap, a straggler's node is promoted from observer to member).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from .beacon import BeaconSlot, RankProgress, progress_of, read_slots
from .dumps import request_dumps, request_end
from .ending import EndAnswer, RankProcess
from .evidence import RankEvidence
from .folders import remove_dead, remove_if_dead, run_dir, sweep_stale, touch

RankAnswers = tuple[tuple[RankProgress, RankEvidence], ...]  # a node's answer: each rank's progress and evidence
DUMPS_TIMEOUT_S, DUMPS_GRACE_S = 5.0, 1.0  # every rank's dumps on a node, all asked at once
END_GRACE_S = 10.0  # for Ray Train to end a hung attempt on its own, after HangError is raised in it
LEASE_EVERY_S = 30.0  # how often a watched folder's lease is refreshed (folders.STALE_S is 20 times that)
RETIRE_S, RETIRE_POLL_S = 60.0, 0.5  # how long an unwatched folder waits for its last processes to end


@dataclass
class Watched:
    """One attempt folder a node watches: the ranks the run placed on this node."""

    key: str
    ranks: frozenset[int]
    leased: float = float("-inf")  # when its lease was last refreshed (the watch's clock)


class NodeWatch:
    """The attempt folders one node logger watches, by key. Its calls come on the logger's control
    thread and its janitor on a thread of its own: one lock, held only for a folder's file
    operations on this node's shared memory (never for a call to anything else)."""

    def __init__(self, root: Path | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._root = root
        self._clock = clock
        self._lock = threading.Lock()
        self._watched: dict[str, Watched] = {}

    def watch(self, key: str, ranks: Collection[int]) -> None:
        """Watch the attempt ``key``'s ``ranks`` on this node (again: its ranks replaced)."""
        with self._lock:
            held = self._watched.get(key)
            if held is None:
                self._watched[key] = Watched(key, frozenset(ranks))
                touch(run_dir(key, self._root))  # the lease at once: the janitor never takes it
            else:
                held.ranks = frozenset(ranks)

    def unwatch(self, key: str) -> None:
        """The attempt ``key`` is over here: its folder goes once no process of it lives (at once
        where none does, else retried on a thread for ``RETIRE_S``; a folder still live then is
        the janitor's)."""
        with self._lock:
            if self._watched.pop(key, None) is None:
                return
            folder = run_dir(key, self._root)
            if remove_if_dead(folder):
                return
        threading.Thread(target=self._retire, args=(key, folder), name="ray_wandb_nodes-unwatch", daemon=True).start()

    def _retire(self, key: str, folder: Path) -> None:
        deadline = self._clock() + RETIRE_S
        while self._clock() < deadline:
            time.sleep(RETIRE_POLL_S)
            with self._lock:
                if key in self._watched or remove_if_dead(folder):  # watched again: not over after all
                    return

    def watching(self) -> dict[str, tuple[int, ...]]:
        with self._lock:
            return {key: tuple(sorted(w.ranks)) for key, w in self._watched.items()}

    def progress(self) -> dict[str, tuple[RankProgress, ...]]:
        """Each watched attempt's ranks here (their beacons; ages on this node's clock). The files
        of its ranks' dead processes are removed as they are read, and its lease refreshed."""
        return {key: tuple(p for p, _ in ranks) for key, ranks in self.read().items()}

    def read(
        self, read_ends: Callable[[str], Collection[tuple[int, int]]] | None = None
    ) -> dict[str, tuple[tuple[RankProgress, bytes], ...]]:
        """As :meth:`progress`, each rank's progress with its slot's extension (bytes 256..511,
        raw: the step anatomy's region, ``b""`` where a write was under way), read in the same
        ``pread``. ``read_ends``: the ``(rank, pid)`` of an attempt whose end was read already
        (the node's death watch, which owns the ranks' files until then): only their files go."""
        out = {}
        with self._lock:
            now = self._clock()
            for key, w in self._watched.items():
                folder = run_dir(key, self._root)
                remove_dead(folder, w.ranks, None if read_ends is None else read_ends(key))
                if now - w.leased >= LEASE_EVERY_S:
                    touch(folder)
                    w.leased = now
                slots = [s for s in read_slots(folder) if s.rank in w.ranks]
                if slots:
                    ns = time.monotonic_ns()
                    out[key] = tuple((progress_of(slot, ns), slot.extension) for slot in slots)
        return out

    def regions(self) -> dict[str, tuple[tuple[int, int, bytes], ...]]:
        """Each watched attempt's ranks here as ``(rank, pid, slot extension)``, read off their
        slots and nothing else (no file removed, no lease kept: the pings do that): the step
        anatomy's frequent local read (``_steps.marks.NodePoints``)."""
        out = {}
        with self._lock:
            watched = {key: (run_dir(key, self._root), frozenset(w.ranks)) for key, w in self._watched.items()}
        for key, (folder, ranks) in watched.items():
            slots = tuple((s.rank, s.pid, s.extension) for s in read_slots(folder) if s.rank in ranks)
            if slots:
                out[key] = slots
        return out

    def janitor(self) -> list[str]:
        """Remove this user's folders on this node that nobody watched for ``folders.STALE_S`` and
        where no process lives (left by a job whose logger died, or by a crash); those watched
        here are kept. Returns the keys removed."""
        with self._lock:
            return sweep_stale(self._root, keep=set(self._watched))


def rank_evidence(key: str, root: Path | None = None, ranks: list[int] | None = None) -> RankAnswers:
    """``ranks`` of the attempt ``key`` on this node (None: every one): each one's progress and
    evidence, all asked at once. Only the ranks the run placed here are asked: nodes that share a
    host's ``/dev/shm`` (Ray nodes in containers sharing it, or a test's simulated cluster) see
    each other's beacons, and a rank asked by two nodes at once would answer one of them."""
    slots = [s for s in read_slots(run_dir(key, root)) if ranks is None or s.rank in ranks]
    # Past the grace, a rank that gave no Python-level dump is signalled once its Python provably
    # cannot run (``dumps``: its dump thread waking for a GIL nobody hands over, its handler still
    # caught); one whose dump thread took its request is waited for until the timeout.
    evidence = request_dumps(slots, timeout_s=DUMPS_TIMEOUT_S, grace_s=DUMPS_GRACE_S, native_frames=True)
    now = time.monotonic_ns()
    return tuple((progress_of(slot, now), e) for slot, e in zip(slots, evidence, strict=True))


def _named(slot: BeaconSlot, processes: dict[tuple[int, int], RankProcess]) -> bool:
    named = processes.get((slot.rank, slot.pid))
    return named is not None and named.proc_start == slot.proc_start


def end_ranks(
    key: str, processes: Sequence[RankProcess], message: str, root: Path | None = None, grace_s: float = END_GRACE_S
) -> EndAnswer:
    """End the named processes of the attempt ``key`` on this node: :class:`HangError` with
    ``message`` raised in each one's training thread (Ray Train then reports it, and ``fit()``
    names the hang), and after ``grace_s`` (on a thread: this returns at once) SIGKILL for one
    still alive, as at once for one whose Python cannot run at all.

    Only a live slot of that folder whose rank, pid and process start time are all as named is
    ended; anything else is refused. An end that comes late (its caller stopped waiting) thus
    never reaches the next attempt's ranks (another folder), another job's (another folder), or a
    process that took a dead rank's pid (another start time)."""
    asked = {(p.rank, p.pid): p for p in processes}
    slots = [slot for slot in read_slots(run_dir(key, root)) if _named(slot, asked)]
    told = [slot for slot in slots if request_end(slot, message)]
    for slot in slots:
        if slot not in told:
            _kill(slot.pid)
    if told:
        args = (run_dir(key, root), asked, grace_s)
        threading.Thread(target=_kill_late, args=args, name="ray_wandb_nodes-hang-end", daemon=True).start()
    ended = tuple(sorted({slot.rank for slot in slots}))
    return EndAnswer(ended, tuple(sorted({p.rank for p in processes} - set(ended))))


def _kill_late(folder: Path, asked: dict[tuple[int, int], RankProcess], grace_s: float) -> None:
    time.sleep(grace_s)
    for slot in read_slots(folder):  # live ones only; a pid taken since has another start time
        if _named(slot, asked):
            _kill(slot.pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
