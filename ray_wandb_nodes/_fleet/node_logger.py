"""``NodeLogger``: the small Ray actor on each node that hosts that node's W&B writers and watches
the train ranks the runs placed there.

A writer that joins a shared run (``Role.NODE``) is there for system metrics: wandb-core
samples this node's GPUs, CPU, memory, disk and network and labels every key with the
node's label. A writer of the node or all strategy (``Role.RUN``) is a run of its own:
it also logs the history rows the controller routes to it and ends with the training's
exit code. The actor takes no CPU (``num_cpus=0``) and sits in a placement-group bundle of
a little memory. It reports failures as data (``status()``) instead of dying, so one bad
node is one warning on the driver side, never a dead run. ``status()`` also carries the
node's latest summary of each writer (see ``_health``): a thread of the actor reads them off
wandb's kept samples every sampling interval (``node_samples``), so a ping never waits on wandb. Each writer has
its own (a Tune trial's writer samples its own trial's processes), and each says its age on
this node's clock.

The ranks' console (``node_console``): for each run it writes for, the logger follows the run's
ranks on this node in the files Ray writes for their processes and writes what they print into
the run (``console``, ``console_end``); a writer's finish hands every rank's last lines over first.

Hang detection's side of the node (``_hang.NodeWatch``) is apart from its writers: the fleet
asks a logger to watch an attempt's folder for the ranks placed on its node (``watch``) and to
let it go when the attempt is over (``unwatch``), whether a writer of that run joined, failed,
or was swapped for another past the writer cap. Each rank's slot, read once a status, gives its
progress and its step anatomy (``steps``: the running totals of its step's parts, decoded). The
same watch looks at how its ranks end (``_failure.NodeDeaths``: their own records, their processes
gone, the cgroup's OOM kills), with or without hang detection, and ``failure_facts`` answers with
it when an attempt failed.

**Threads.** Ray runs the actor's calls in three concurrency groups. The writer calls (joining,
logging, finishing, offline packing and copying: each may wait minutes on wandb or storage) run
one at a time, in the order sent, in Ray's default group. The control calls (``status``,
``watch``, ``unwatch``, ``end_ranks``, ``failure_facts``, ``console_end``) run on a thread of
their own, so that a ping, a watch and an end are answered while a writer joins or finishes; ``hang_evidence`` on up to
``EVIDENCE_THREADS`` threads (each bounded by its dumps' timeout). The hosted writers (one
:class:`HostedRun` a writer key) are changed by the writer calls only, under ``_lock``; every
other thread reads them under it, as a snapshot, and never waits on wandb. The watched folders
are the ``NodeWatch``'s, behind its own lock; a writer's summary reader guards its own state.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import ray

from .. import _ray
from .._egress import Way, WriterEgress, find_way, for_way, online
from .._failure import SETTLE_S, NodeDeaths, NodeFacts
from .._hang import EndAnswer, NodeWatch, RankAnswers, RankProcess, RankProgress, end_ranks, rank_evidence
from .._health import NodeSummary
from .._wandb.artifacts import checkpoint_artifact
from .._wandb.metrics import Stepper
from .._wandb.runs import init_writer
from .._wandb.writers import Role, WriterSpec, node_dir
from .._warn import describe
from ..offline import index as _index
from .hosted import EARLY_ROWS, Collected, HostedRun, finish_hosted, node_uploads
from .node_console import NodeConsoles, last_words
from .node_offline import OfflineRuns
from .node_samples import NodeSamples, taken
from .node_steps import NodeSteps
from .wire import ConsoleEnd, ConsoleRanks, LoggerStatus

# How long a writer's finish waits for its checkpoints still being built, then for wandb's answer
# on their uploads (the driver side bounds the whole finish anyway).
BUILD_WAIT_S, WATCH_END_S = 300.0, 5.0
CONTROL, EVIDENCE = "control", "evidence"  # the concurrency groups of the calls that never wait on a writer
EVIDENCE_THREADS = 4  # hang evidence asked by several runs at once (two jobs on one node)
CONCURRENCY_GROUPS = {CONTROL: 1, EVIDENCE: EVIDENCE_THREADS}
_Call = TypeVar("_Call", bound=Callable[..., Any])


def in_group(group: str) -> Callable[[_Call], _Call]:
    """The actor call runs in concurrency group ``group`` (``ray.method``; called in process, it
    is the method as it is)."""
    mark: Callable[[_Call], _Call] = ray.method(concurrency_group=group)
    return mark


class NodeLogger(OfflineRuns):
    def __init__(self, specs: list[WriterSpec] | None = None, *, root: Path | None = None) -> None:
        os.environ.pop("WANDB_SERVICE", None)
        self._lock = threading.Lock()  # the table of hosted writers (see the module's docstring)
        self._hosted: dict[str, HostedRun] = {}
        self._warm_error: str | None = None
        self._restarted = _ray.was_restarted()
        self._samples = NodeSamples(self._joined)  # each writer's summary, read on a thread of its own
        self._said = Collected()
        self._writing = threading.Lock()  # a run's rows (the writer calls) and artifacts (their own), one at a time
        self._watch = NodeWatch(root)
        self._consoles = NodeConsoles(self._said, self._writing, from_end=self._restarted)
        self._deaths = NodeDeaths(root, last_words=last_words)  # how the watched ranks end (kept past their files)
        self._relay_lost: set[str] = set()  # writers whose relay died (see relay_lost)
        self._steps = NodeSteps(self._watch)  # the ranks' step totals as points between pings
        # Folders of this user that no live run watches and whose processes are all dead: left by
        # a logger that died, or a job that crashed (never a live job's: see folders.sweep_stale).
        threading.Thread(target=self._watch.janitor, name="ray_wandb_nodes-shm-janitor", daemon=True).start()
        for spec in specs or []:
            self.add_writer(spec)

    # writers (the default group: one call at a time, in order) ---------------------------------
    def add_writer(self, spec: WriterSpec, egress: WriterEgress | None = None) -> LoggerStatus:
        """Start ``spec``'s writer (idempotent per run id); returns :meth:`status`.

        With ``egress``, an online writer first checks its way to W&B from this node (bounded:
        ``egress.timeout_s`` a check, at most two): straight, else through the relay when the
        run has one, else it writes offline here, to be brought into the run at its end. What it
        found rides the status (``egress``)."""
        held = self._hosted.get(spec.run_id)
        if held is not None and held.run is not None:
            return self.status()
        with self._lock:
            record = self._hosted.setdefault(spec.run_id, HostedRun(spec.run_id))
            record.spec, record.error = spec, None
        try:
            if egress is not None and online(spec):
                found = find_way(spec, egress)
                spec = for_way(spec, found, egress.route)
                with self._lock:
                    record.spec, record.egress = spec, found
            offline = spec.settings.get("mode") == "offline"
            # A relayed writer writes where an offline one does: should the relay die, the fleet
            # brings its run in from there at the end (pack_offline), as a node without a route's.
            relayed = record.egress is not None and record.egress.way is Way.RELAY
            path = node_dir(spec.init_kwargs.get("dir"), spec.run_id, spec.label, offline=offline or relayed)
            run = init_writer(spec, log_brought_in=offline or relayed, dir=path)
            stepper = Stepper.resuming(spec.step_metric, run)
            with self._lock:
                record.run, record.stepper = run, stepper
                early, record.early = record.early, []
            for row in early:
                self.log(spec.run_id, row)
            self._consoles.joined(spec.run_id, run)
            self._samples.start(float(spec.settings.get("x_stats_sampling_interval") or 15.0))
        except Exception as e:  # noqa: BLE001 - reported through status()
            with self._lock:
                record.error = describe(e)
        return self.status()

    def _joined(self) -> list[HostedRun]:
        with self._lock:
            return [r for r in self._hosted.values() if r.run is not None]

    def read_samples(self) -> None:
        """Read every writer's kept samples into its own summary."""
        self._samples.read_all()

    def warm(self) -> None:
        """Start wandb's service in this process ahead of any writer (a logger started before the
        train workers are placed): a join is then only the run handshake."""
        try:
            import wandb

            wandb.setup()
        except Exception as e:  # noqa: BLE001 - the join will start it, or say why not
            self._warm_error = describe(e)

    def log(self, run_id: str, row: dict[str, Any]) -> None:
        """Log one history row to a run this actor hosts (the node and all strategies)."""
        record = self._hosted.get(run_id)
        if record is None or record.run is None or record.stepper is None:
            with self._lock:  # before its writer: kept for it (a restarted actor gets its writers back later)
                early = self._hosted.setdefault(run_id, HostedRun(run_id)).early
                if len(early) < EARLY_ROWS:
                    early.append(row)
            return
        try:
            with self._writing:
                record.run.log(record.stepper.stamp(dict(row)))
            with self._lock:
                record.logged += 1
        except Exception as e:  # noqa: BLE001
            with self._lock:
                record.error = f"log failed: {describe(e)}"

    def console(self, ranks: ConsoleRanks) -> None:
        """Follow the run's ranks on this node into its Logs tab (after its writer's join: in order)."""
        record = self._hosted.get(ranks.run_id)
        self._consoles.ranks(ranks, record.run if record is not None else None)

    def log_artifact(self, run_id: str, checkpoint: Any, name: str, aliases: list[str]) -> None:
        """Log a checkpoint as an artifact of a run this actor hosts, as the primary does (``node_uploads``)."""
        record = self._hosted.get(run_id)
        if record is None or record.run is None:
            return
        if record.uploads is None:
            record.uploads = node_uploads(record.run, self._said, self._writing)
        make = functools.partial(checkpoint_artifact, name=name, checkpoint=checkpoint)
        record.uploads.add(make, aliases, name, str(getattr(checkpoint, "path", "")))

    def finish(self, run_id: str | None = None, exit_code: int | None = None) -> LoggerStatus:
        """Finish one writer, or all when ``run_id`` is None.

        Only a writer that is its own run (``Role.RUN``) sends a final state, with
        ``exit_code``; a writer that joined a shared run never does. The ranks' console it writes
        ends first: their last lines too where ``exit_code`` says the run failed. The answer carries each
        finished writer's last summary (``final``): its samples read just before the finish and
        its transaction log read to the end after it, the last, partial block included, so that
        the run's final judgement sees what no ping could (bounded: ``reader.FINAL_WAIT_S``).
        The ranks this node watches for the run stay watched: a writer's end is not theirs.
        """
        with self._lock:
            keys = [run_id] if run_id is not None else list(self._hosted)
            ended = [record for key in keys if (record := self._hosted.pop(key, None)) is not None]
        final: dict[str, NodeSummary] = {}
        for record in ended:
            self._consoles.finish(record.key, failed=exit_code not in (None, 0))  # the ranks' last lines first
            if record.run is None:
                continue
            self._samples.read(record)  # the newest samples, while wandb still keeps them
            if record.uploads is not None:  # the checkpoints still being built are logged first
                record.uploads.drain(BUILD_WAIT_S)
            finish_hosted(record, exit_code, given_up=functools.partial(self._relay_lost.__contains__, record.key))
            last = self._samples.last(record)
            if last is not None:
                final[record.key] = last
            if record.uploads is not None:  # the finish waited for the uploads: say which W&B did not commit
                record.uploads.finished(WATCH_END_S)
            if record.role is Role.OBSERVER:  # its samples were for the table only
                shutil.rmtree(_index.node_local_dir(record.key, record.label), ignore_errors=True)
        return self.status(final, ended=ended)

    @in_group(CONTROL)
    def relay_lost(self, key: str) -> None:
        """The relay the writer ``key`` sent through died: its finish does not wait on it."""
        self._relay_lost.add(key)

    # control calls (a thread of their own: answered while a writer call runs) ------------------
    @in_group(CONTROL)
    def status(self, final: dict[str, NodeSummary] | None = None, ended: Sequence[HostedRun] = ()) -> LoggerStatus:
        """What this logger holds now; ``final``: the last summaries of the writers ``ended`` just now."""
        with self._lock:
            hosted = list(self._hosted.values())
            added = [r for r in hosted if r.spec is not None]  # joined, or joining now
            labels = {r.key: r.label for r in added}
            logged = {r.key: r.logged for r in hosted if r.logged}
            errors = {r.key: r.error for r in (*hosted, *ended) if r.error}
            egress = {r.key: r.egress for r in hosted if r.egress is not None}
        if self._warm_error:
            errors["warm"] = self._warm_error
        problems = {r.key: p for r in (*hosted, *ended) if (p := r.problems())}
        read = self._read_watched()  # every watched rank's slot, once: its progress and its step anatomy
        return LoggerStatus(
            pid=os.getpid(),
            node_id=ray.get_runtime_context().get_node_id(),
            hostname=socket.gethostname(),
            restarted=self._restarted,
            runs=tuple(sorted(r.key for r in added)),
            labels=labels,
            logged=logged,
            errors=errors,
            summaries=self.summaries(hosted),
            problems=problems,
            progress={key: tuple(p for p, _ in ranks) for key, ranks in read.items()},
            steps=self._steps.take(read),
            final=final or {},
            warnings=self._said.said,
            egress=egress,
            ranks_memory={key: memory for key in read if (memory := self._deaths.memory(key))},
        )

    def summaries(self, hosted: Sequence[HostedRun] | None = None, now: float | None = None) -> dict[str, NodeSummary]:
        """Each writer's latest summary (by writer key), with its age on this node's clock, and
        the integer GPU batches no ping has carried twice yet (a ping's status takes them)."""
        if hosted is None:
            with self._lock:
                hosted = list(self._hosted.values())
        return taken(hosted, now)

    # hangs: the train ranks of this node, read off their beacons --------------------------------
    def _read_watched(self) -> dict[str, tuple[tuple[RankProgress, bytes], ...]]:
        """Each watched attempt's ranks on this node with their slots' extensions. How they end is
        looked at first, and only the files of processes whose end was read go: the death watch
        owns a rank's files until then, on every node (a rank killed between two pings is found
        gone with its record, and its kill read against the count before it)."""
        self._deaths.look(self._watch.watching())
        return self._watch.read(self._deaths.ended)

    @in_group(CONTROL)
    def watch(self, key: str, ranks: tuple[int, ...]) -> None:
        """Watch the attempt ``key``'s ``ranks`` on this node (their beacons ride each status)."""
        self._watch.watch(key, ranks)
        self._steps.start()

    @in_group(CONTROL)
    def unwatch(self, key: str) -> None:
        """The attempt ``key`` is over here: its folder goes once none of its processes lives (how
        its ranks ended is kept a while: see ``_failure.deaths``)."""
        self._deaths.look(self._watch.watching())
        self._watch.unwatch(key)

    @in_group(CONTROL)
    def console_end(self, end: ConsoleEnd) -> None:
        """The run's attempt ended: its ranks' last lines go to the run when it failed. Returns at once."""
        self._consoles.end(end)

    @in_group(EVIDENCE)
    def hang_evidence(self, key: str, ranks: list[int] | None = None) -> RankAnswers:
        """``ranks`` of the attempt ``key`` here (None: every one) asked for their evidence at once (bounded)."""
        return rank_evidence(key, ranks=ranks)

    @in_group(CONTROL)
    def end_ranks(self, key: str, processes: Sequence[RankProcess], message: str) -> EndAnswer:
        """End the named processes of the attempt ``key`` on this node (a hung attempt, so that Ray
        restarts it); refuses any other (see ``_hang.end_ranks``). Returns at once."""
        return end_ranks(key, processes, message)

    @in_group(CONTROL)
    def failure_facts(self, key: str, ranks: Sequence[int]) -> NodeFacts:
        """How ``ranks`` of the attempt ``key`` ended on this node: their own records, their
        processes found gone, the OOM kills its cgroup counted, its last memory sample."""
        with self._lock:
            summaries = [r.reader.summary for r in self._hosted.values()]
        memory = next((s.mem for s in summaries if s is not None and s.mem is not None), None)
        return self._deaths.facts(key, ranks, memory, settle_s=SETTLE_S)

    def hosts(self, key: str) -> bool:
        """Whether the writer ``key`` is joined here now (see :class:`OfflineRuns`)."""
        record = self._hosted.get(key)
        return record is not None and record.run is not None


def logger_class() -> Any:
    """``NodeLogger`` as a Ray actor class, with its concurrency groups."""
    return ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(NodeLogger)
