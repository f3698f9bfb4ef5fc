"""``NodeLogger``: the small Ray actor on each node that hosts that node's W&B writers.

A writer that joins a shared run (``role="node"``) is there for system metrics: wandb-core
samples this node's GPUs, CPU, memory, disk and network and labels every key with the
node's label. A writer of the node or all strategy (``role="run"``) is a run of its own:
it also logs the history rows the controller routes to it and ends with the training's
exit code. The actor takes no CPU (``num_cpus=0``) and sits in a placement-group bundle of
a little memory. It reports failures as data (``status()``) instead of dying, so one bad
node is one warning on the driver side, never a dead run. ``status()`` also carries the
node's latest summary of each writer (see ``_health``): a thread of the actor reads them off
wandb's kept samples every sampling interval, so a ping never waits on wandb. Each writer has
its own (a Tune trial's writer samples its own trial's processes), and each says its age on
this node's clock.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import threading
import time
from typing import Any

from .. import _ray
from .._artifacts import checkpoint_artifact
from .._hang import (
    BeaconSlot,
    RankEvidence,
    RankProgress,
    progress_of,
    read_slots,
    request_dumps,
    request_end,
    run_dir,
)
from .._health import Degradation, NodeSummary, ReadProblem, SummaryReader, aged
from .._metrics import Stepper
from .._uploads import ArtifactUploads, Upload
from .._wandb_io import init_writer
from .._warn import Warner, describe
from .._writers import WriterSpec, node_dir
from ..offline import index as _index
from ..offline import storage as _storage
from ..offline import transfer as _transfer
from .plan import run_of
from .wire import LoggerStatus

RankAnswers = tuple[tuple[RankProgress, RankEvidence], ...]  # a node's answer: each rank's progress and evidence
DUMPS_TIMEOUT_S, DUMPS_GRACE_S = 5.0, 1.0  # every rank's dumps on a node, all asked at once
END_GRACE_S = 10.0  # for Ray Train to end a hung attempt on its own, after HangError is raised in it
# How long a writer's finish waits for its checkpoints still being built, then for wandb's answer
# on their uploads (the driver side bounds the whole finish anyway).
BUILD_WAIT_S, WATCH_END_S = 300.0, 5.0


class Collected(Warner):
    """Warnings said in the actor, kept for its status (the driver side says each once)."""

    def __init__(self) -> None:
        super().__init__()
        self.said: dict[str, str] = {}

    def warn(self, key: str, message: str) -> None:
        self.said.setdefault(key, message)


def node_uploads(run: Any, warner: Warner, writing: threading.Lock) -> ArtifactUploads:
    """A standalone run's checkpoint artifacts in the actor: each logged on its artifact thread as
    soon as it is built (the actor's calls never wait on a checkpoint being hashed), never while
    the actor's thread logs a row (``writing``: wandb's run is used by one thread at a time)."""

    def hand(artifact: Any, upload: Upload) -> None:
        with writing:
            uploads.log(run, artifact, upload)

    uploads = ArtifactUploads(hand, threading.Event(), warner)
    return uploads


class NodeLogger:
    def __init__(self, specs: list[WriterSpec] | None = None) -> None:
        os.environ.pop("WANDB_SERVICE", None)
        self._runs: dict[str, Any] = {}
        self._roles: dict[str, str] = {}
        self._steppers: dict[str, Stepper] = {}
        self._errors: dict[str, str] = {}
        self._labels: dict[str, str] = {}
        self._logged: dict[str, int] = {}
        # Rows that arrive before their writer (a restarted actor gets its writers back later).
        self._early: dict[str, list[dict[str, Any]]] = {}
        self._restarted = _ray.was_restarted()
        # Each writer's latest samples, read off it on a thread of their own (never in a call).
        self._readers: dict[str, SummaryReader] = {}
        self._read_errors: dict[str, ReadProblem] = {}  # a writer whose samples could not be read, and why
        self._sample_s = 15.0
        self._reading = threading.Lock()  # one read of a writer's samples at a time (the sampler's, a finish's)
        self._sampler: threading.Thread | None = None
        self._uploads: dict[str, ArtifactUploads] = {}  # each standalone run's checkpoint artifacts
        self._said = Collected()
        self._writing = threading.Lock()  # a run's rows (the actor's thread) and artifacts (their own), one at a time
        for spec in specs or []:
            self.add_writer(spec)

    def add_writer(self, spec: WriterSpec) -> LoggerStatus:
        """Start ``spec``'s writer (idempotent per run id); returns :meth:`status`."""
        if spec.run_id in self._runs:
            return self.status()
        self._labels[spec.run_id] = spec.label
        self._roles[spec.run_id] = spec.role
        try:
            offline = spec.settings.get("mode") == "offline"
            path = node_dir(spec.init_kwargs.get("dir"), spec.run_id, spec.label, offline=offline)
            run = init_writer(spec, dir=path)
            self._runs[spec.run_id] = run
            self._steppers[spec.run_id] = Stepper.resuming(spec.step_metric, run)
            self._errors.pop(spec.run_id, None)
            for row in self._early.pop(spec.run_id, []):
                self.log(spec.run_id, row)
            self._start_sampler(float(spec.settings.get("x_stats_sampling_interval") or 15.0))
        except Exception as e:  # noqa: BLE001 - reported through status()
            self._errors[spec.run_id] = describe(e)
        return self.status()

    def _start_sampler(self, interval_s: float) -> None:
        self._sample_s = min(self._sample_s, max(0.5, interval_s))
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, name="ray_wandb_nodes-summary", daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        stop = threading.Event()
        while not stop.wait(self._sample_s):
            self.read_samples()

    def read_samples(self) -> None:
        """Read every writer's kept samples into its own summary."""
        for run_id, run in list(self._runs.items()):
            self._read(run_id, run, self._readers.setdefault(run_id, SummaryReader()))

    def summaries(self, now: float | None = None) -> dict[str, NodeSummary]:
        """Each writer's latest summary (by writer key), with its age on this node's clock, and
        the integer GPU batches no ping has carried twice yet (a ping's status takes them)."""
        out = {}
        for run_id, reader in list(self._readers.items()):
            summary = aged(reader.take(), now)
            if summary:
                out[run_id] = summary
        return out

    def warm(self) -> None:
        """Start wandb's service in this process ahead of any writer (a logger started before the
        train workers are placed): a join is then only the run handshake."""
        try:
            import wandb

            wandb.setup()
        except Exception as e:  # noqa: BLE001 - the join will start it, or say why not
            self._errors["warm"] = describe(e)

    def log(self, run_id: str, row: dict[str, Any]) -> None:
        """Log one history row to a run this actor hosts (the node and all strategies)."""
        run = self._runs.get(run_id)
        if run is None:
            early = self._early.setdefault(run_id, [])
            if len(early) < 10_000:
                early.append(row)
            return
        try:
            with self._writing:
                run.log(self._steppers[run_id].stamp(dict(row)))
            self._logged[run_id] = self._logged.get(run_id, 0) + 1
        except Exception as e:  # noqa: BLE001
            self._errors[run_id] = f"log failed: {describe(e)}"

    def log_artifact(self, run_id: str, checkpoint: Any, name: str, aliases: list[str]) -> None:
        """Log a checkpoint as an artifact of a run this actor hosts, as the primary does (``node_uploads``)."""
        run = self._runs.get(run_id)
        if run is None:
            return
        uploads = self._uploads.get(run_id)
        if uploads is None:
            uploads = self._uploads[run_id] = node_uploads(run, self._said, self._writing)
        make = functools.partial(checkpoint_artifact, name=name, checkpoint=checkpoint)
        uploads.add(make, aliases, name, str(getattr(checkpoint, "path", "")))

    def status(self, final: dict[str, NodeSummary] | None = None) -> LoggerStatus:
        """What this logger holds now; ``final``: the last summaries of the writers just finished."""
        import ray

        problems: dict[str, tuple[ReadProblem, ...]] = {}
        for run_id, reader in list(self._readers.items()):
            if reader.problems:
                problems[run_id] = tuple(reader.problems.values())
        for run_id, problem in self._read_errors.items():
            problems[run_id] = (*problems.get(run_id, ()), problem)
        return LoggerStatus(
            pid=os.getpid(),
            node_id=ray.get_runtime_context().get_node_id(),
            hostname=socket.gethostname(),
            restarted=self._restarted,
            runs=tuple(sorted(self._runs)),
            labels=dict(self._labels),
            logged=dict(self._logged),
            errors=dict(self._errors),
            summaries=self.summaries(),
            problems=problems,
            progress=self.progress(),
            final=final or {},
            warnings=dict(self._said.said),
        )

    # hangs: the train ranks of this node, read off their beacons ------------------------------
    def progress(self) -> dict[str, tuple[RankProgress, ...]]:
        """Each hosted run's ranks on this node (their beacons; ages on this node's clock)."""
        out = {}
        for run_id in {run_of(key)[0] for key in self._runs}:
            slots = read_slots(run_dir(run_id))
            if slots:
                now = time.monotonic_ns()
                out[run_id] = tuple(progress_of(slot, now) for slot in slots)
        return out

    def hang_evidence(self, run_id: str, ranks: list[int] | None = None) -> RankAnswers:
        """``ranks`` of ``run_id`` here (None: every one) asked for their evidence at once (bounded)."""
        return rank_evidence(run_id, ranks=ranks)

    def end_ranks(self, run_id: str, ranks: list[int], message: str) -> list[int]:
        """End ``ranks`` of ``run_id`` on this node (a hung attempt, so that Ray restarts it);
        returns at once with the ranks asked (see :func:`end_ranks`)."""
        return end_ranks(run_id, ranks, message)

    def finish(self, run_id: str | None = None, exit_code: int | None = None) -> LoggerStatus:
        """Finish one writer, or all when ``run_id`` is None.

        Only a writer that is its own run (``role="run"``) sends a final state, with
        ``exit_code``; a writer that joined a shared run never does. The answer carries each
        finished writer's last summary (``final``): its samples read just before the finish and
        its transaction log read to the end after it, the last, partial block included, so that
        the run's final judgement sees what no ping could (bounded: ``reader.FINAL_WAIT_S``).
        """
        ids = [run_id] if run_id is not None else list(self._runs)
        final: dict[str, NodeSummary] = {}
        for rid in ids:
            run = self._runs.pop(rid, None)
            reader = self._readers.pop(rid, None)
            if run is None:
                continue
            self._read(rid, run, reader)  # the newest samples, while wandb still keeps them
            uploads = self._uploads.pop(rid, None)
            if uploads is not None:  # the checkpoints still being built are logged first
                uploads.drain(BUILD_WAIT_S)
            try:
                if self._roles.get(rid) == "run" and exit_code is not None:
                    run.finish(exit_code=exit_code)
                else:
                    run.finish()
            except Exception as e:  # noqa: BLE001
                self._errors[rid] = f"finish failed: {describe(e)}"
            shutil.rmtree(run_dir(run_of(rid)[0]), ignore_errors=True)  # its ranks' beacons and dumps
            last = self._last_summary(rid, run, reader)
            if last is not None:
                final[rid] = last
            if uploads is not None:  # the finish waited for the uploads: say which W&B did not commit
                uploads.finished(WATCH_END_S)
            if self._roles.get(rid) == "observer":  # its samples were for the table only
                shutil.rmtree(_index.node_local_dir(rid, self._labels.get(rid, "")), ignore_errors=True)
        return self.status(final)

    def _read(self, run_id: str, run: Any, reader: SummaryReader | None) -> None:
        if reader is None:
            return
        try:
            with self._reading:
                reader.read(run)
        except Exception as e:  # noqa: BLE001 - one writer's failed read never stops the others' or its finish
            self._read_errors[run_id] = ReadProblem(Degradation.SAMPLES_UNREADABLE, type(e).__name__, describe(e))

    def _last_summary(self, run_id: str, run: Any, reader: SummaryReader | None) -> NodeSummary | None:
        """A finished writer's last summary: the rest of its transaction log read (see finish)."""
        if reader is None:
            return None
        try:
            with self._reading:
                return aged(reader.final(run))
        except Exception as e:  # noqa: BLE001
            self._read_errors[run_id] = ReadProblem(Degradation.SAMPLES_UNREADABLE, type(e).__name__, describe(e))
            return None

    # offline runs: brought to the driver side at the end -----------------------------------
    def pack_offline(self, run_id: str, label: str, max_bytes: int | None = None) -> dict[str, Any]:
        """Finish ``run_id``'s writer if it still runs, then pack its offline folder.

        The folder is found by path, not by memory, so the runs of a logger that restarted
        are packed too. Returns the archive's path and size (0 when there is nothing; no archive
        above ``max_bytes``).
        """
        if run_id in self._runs:
            self.finish(run_id)
        folder = _index.node_local_dir(run_id, label)
        if not os.path.isdir(folder) or not os.listdir(folder):
            return {"archive": None, "bytes": 0}
        archive, size = _transfer.pack(folder)  # replaces the archive of an earlier try
        if max_bytes is not None and size > max_bytes:
            os.remove(archive)  # too big to bring over: the folder itself stays
            return {"archive": None, "bytes": size}
        return {"archive": archive, "bytes": size}

    def put_offline(self, archive: str, storage: _storage.StorageSpot, label: str, seconds: float) -> str:
        """Copy a packed offline run into the run's storage within ``seconds`` (a duration, timed here)."""
        return _storage.put(archive, storage, label, seconds)

    def remove_stored(self, storage: _storage.StorageSpot, label: str) -> None:
        """Delete a copy :meth:`put_offline` made (the driver side could not read it)."""
        _storage.remove(storage, label)

    def drop_archive(self, archive: str) -> None:
        """Delete a packed archive that will not be fetched (its folder stays)."""
        try:
            os.remove(archive)
        except OSError:
            pass

    def read_offline(self, archive: str, offset: int) -> bytes:
        return _transfer.read_chunk(archive, offset)

    def discard_offline(self, run_id: str, label: str) -> None:
        """Remove the node's copy once the driver side holds it."""
        _transfer.discard(_index.node_local_dir(run_id, label))


def rank_evidence(run_id: str, root: Any = None, ranks: list[int] | None = None) -> RankAnswers:
    """``ranks`` of ``run_id`` on this node (None: every one): each one's progress and evidence,
    all asked at once. Only the ranks the run placed here are asked: nodes that share a host's
    ``/dev/shm`` (Ray nodes in containers sharing it, or a test's simulated cluster) see each
    other's beacons, and a rank asked by two nodes at once would answer one of them."""
    slots = [s for s in read_slots(run_dir(run_id, root)) if ranks is None or s.rank in ranks]
    # Past the grace, a rank that gave no Python-level dump is signalled once its Python provably
    # cannot run (``dumps``: its dump thread waking for a GIL nobody hands over, its handler still
    # caught); one whose dump thread took its request is waited for until the timeout.
    evidence = request_dumps(slots, timeout_s=DUMPS_TIMEOUT_S, grace_s=DUMPS_GRACE_S, native_frames=True)
    now = time.monotonic_ns()
    return tuple((progress_of(slot, now), e) for slot, e in zip(slots, evidence, strict=True))


def end_ranks(run_id: str, ranks: list[int], message: str, root: Any = None, grace_s: float = END_GRACE_S) -> list[int]:
    """End ``ranks`` of ``run_id`` on this node: :class:`HangError` with ``message`` raised in
    each one's training thread (Ray Train then reports it, and ``fit()`` names the hang), and
    after ``grace_s`` (on a thread: this returns at once) SIGKILL for a process still alive, as
    for one whose Python cannot run at all. Returns the ranks asked."""
    slots = [slot for slot in read_slots(run_dir(run_id, root)) if slot.rank in ranks]
    asked = [slot for slot in slots if request_end(slot, message)]
    for slot in slots:
        if slot not in asked:
            _kill(slot.pid)
    if asked:
        threading.Thread(target=_kill_late, args=(asked, grace_s), name="ray_wandb_nodes-hang-end", daemon=True).start()
    return [slot.rank for slot in slots]


def _kill_late(slots: list[BeaconSlot], grace_s: float) -> None:
    time.sleep(grace_s)
    alive = {(s.pid, s.rank) for s in read_slots(slots[0].path.parent)}
    for slot in slots:
        if (slot.pid, slot.rank) in alive:
            _kill(slot.pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
