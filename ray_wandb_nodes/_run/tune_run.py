"""The W&B side of one Tune experiment, on the Tune driver: one shared-mode run per trial.

Each trial's session has a primary writer on the driver and a writer on the trial's node (and,
for a trial wrapping a ``TorchTrainer`` with ``WandbNodesCallback``, on its train workers' nodes),
all served by one node fleet.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import _ray
from .._config.options import Options
from .._config.secrets import CapturedEnv
from .._config.values import NodeSelection
from .._failure import FailedAttempt, RankPlace, RayPoll
from .._fleet import FailureWatch, HangSetting, NodeFleet, NodeInfo, Relayed, RunProcess, RunWriter, SharedTarget
from .._gpu_ids import GpuSlots
from .._health import HealthMonitor, HealthOptions, NodeState, TickResult
from .._ray.failures import trial_error
from .._wandb.metrics import RowBuilder, config_for_wandb
from .._wandb.writers import WriterSpec, node_spec, primary_spec
from .._warn import Warner, describe
from ..offline.storage import StorageSpot, storage_spot
from . import handoff as _handoff
from .primary import PrimaryWriter
from .session import FLEET_SLACK_S, UNCREATED_WAIT_S, SharedSession

if TYPE_CHECKING:
    from ray.tune.experiment import Trial


class TuneRuns:
    def __init__(
        self, options: Options, env: CapturedEnv, warner: Warner, *, driver_cwd: str, rows: RowBuilder
    ) -> None:
        import ray

        self.options, self._env, self._warner = options, env, warner
        self._driver_cwd = driver_cwd
        self._row_builder = rows
        self.driver_node = NodeInfo(ray.get_runtime_context().get_node_id(), socket.gethostname(), "")
        self.fleet = NodeFleet(init_timeout_s=options.init_timeout_s, warner=warner)
        self.sessions: dict[str, SharedSession] = {}  # trial id -> its run's session
        self.marks = TrialMarks(warner)
        # trial id -> its actor's process, once found: written by the thread that finds it, read by
        # Tune's hooks (one immutable value a trial, replaced whole when a restarted trial moves)
        self._locations: dict[str, RunProcess] = {}
        self._recovering: dict[str, int] = {}  # trial id -> the attempt that trains again once it reports

    def start(self, trial: Trial, run_id: str) -> SharedSession:
        """The session of ``trial``'s run: a new one, or the one it has (a restarted trial)."""
        session = self.sessions.get(trial.trial_id)
        actor = _ray.trial_actor(trial)
        if session is not None and not session.finishing:
            # A restarted trial: its actor may sit on another node now.
            if session.primary.ready:
                self._locate_later(session, actor, trial.trial_id)
            return session
        self.marks.mark(trial.trial_id, run_id)  # before the trial's function runs
        session = self._new_session(trial, run_id, actor)
        self.sessions[trial.trial_id] = session
        session.start()
        return session

    def _new_session(self, trial: Trial, run_id: str, actor: Any) -> SharedSession:
        config = {k: v for k, v in dict(trial.config).items() if k not in self.options.excludes and k != "callbacks"}
        local_path = _ray.trial_local_path(trial)
        if local_path:  # as Ray's WandbLoggerCallback: where the trial's own files are
            config["trial_log_path"] = local_path
        spec = primary_spec(
            self.options,
            self._env,
            mode=self.options.mode,
            run_id=run_id,
            label=self.driver_node.label,
            display_name=str(trial),
            group=_ray.trial_experiment(trial),
            config=config_for_wandb(config, self._warner.warn),
            default_dir=local_path if local_path and os.path.isdir(local_path) else self._driver_cwd,
        )
        primary = PrimaryWriter(
            spec,
            warner=self._warner,
            rows=_new_config_only(self._row_builder),
            # on the writer thread, once the session has started: `target` is set by then
            prepare=lambda s: self._locate_trial(s, target=target, actor=actor, trial_id=trial.trial_id),
        )
        storage: StorageSpot | None = None
        why_not: str | None = None
        if spec.offline_dir is not None:  # offline: the node writers' runs come to the driver
            experiment, why_not = storage_spot(self.options.offline_transfer, *_ray.trial_storage(trial))
            storage = experiment.for_run(run_id) if experiment is not None else None
        if why_not is not None:
            self._warner.warn("offline-storage", f"offline runs come through Ray: {why_not}")
        target = SharedTarget(
            primary=primary,
            selection=self.options.nodes,
            relay=TrialRelayed(trial.trial_id) if self.options.nodes is NodeSelection.WORKERS else None,
            spec_for=_node_writer_spec,
            storage=storage,
            health=TrialHealth(
                HealthOptions(
                    threshold=self.options.straggler_threshold,
                    window_s=self.options.straggler_window_s,
                    alerts=self.options.alerts,
                    compare_all=True,  # a trial's nodes all run the trial
                    history_every_s=self.options.sampling_interval_s,
                )
            ),
            max_writers=self.options.max_node_writers,
            failures=FailureWatch(),
        )
        return SharedSession(target, primary, self.fleet, self.options.finish_timeout_s)

    def _locate_trial(self, spec: WriterSpec, *, target: SharedTarget, actor: Any, trial_id: str) -> WriterSpec:
        """On the writer thread, before the run exists: find the trial's node and pid, and
        tell the fleet (the run's process and nodes reach it before the run is ready).

        The primary samples system metrics only when the trial runs on the driver's node
        (then of the trial's process); otherwise the trial's node gets a node writer and the
        primary samples nothing, so the run shows the nodes the trial used and no other.
        """
        found = _ray.actor_location(actor, timeout=self.options.init_timeout_s)
        settings = dict(spec.settings)
        if found is None:
            settings["x_disable_stats"] = True
            self._warner.warn("locate", "could not find a trial's node; its run may lack that node's system metrics")
            return _with_settings(spec, settings)
        node_id, pid = found.node_id, found.pid
        covered = node_id if node_id == self.driver_node.node_id else None
        self._locations[trial_id] = RunProcess(node_id, pid)
        self.fleet.located(spec.run_id, RunProcess(node_id, pid), target)
        self.fleet.set_run_nodes(spec.run_id, {node_id}, covered, target=target, **trial_gpus(found))
        if covered is not None:
            settings["x_stats_pid"] = pid
        else:
            settings["x_disable_stats"] = True
        return _with_settings(spec, settings)

    def _locate_later(self, session: SharedSession, actor: Any, trial_id: str) -> None:
        covered = session.primary.spec.settings.get("x_stats_pid") is not None  # its spec, as its thread prepared it

        def work() -> None:
            found = _ray.actor_location(actor, timeout=self.options.init_timeout_s)
            if found is None:
                return
            node_id = found.node_id
            driver = self.driver_node.node_id
            self._locations[trial_id] = RunProcess(node_id, found.pid)
            session.set_nodes({node_id}, node_id if covered and node_id == driver else None, **trial_gpus(found))

        threading.Thread(target=work, daemon=True).start()

    def trial_failed(self, trial: Trial, retrying: bool) -> None:
        """``trial`` failed (its function raised, or its actor died): named in its run from Tune's
        record of the error (read here: Tune has just written it, and a retry's next failure
        overwrites it), as rank 0 on the trial's node; decided on the fleet thread, where a Train
        run inside the trial that names its own failures takes precedence."""
        session = self.sessions.get(trial.trial_id)
        if session is None or session.finishing:
            return
        attempt = max(1, int(getattr(trial, "num_failures", 1) or 1))
        error = trial_error(trial)
        where = self._locations.get(trial.trial_id)
        places = ((where.node_id, RankPlace(0, f"node-{where.node_id[:8]}", (), where.pid)),) if where else ()
        max_failures = int(getattr(trial, "max_failures", 0) or 0)
        poll = RayPoll((error,)) if error is not None else None
        failed = FailedAttempt(attempt, retrying, max_failures, poll, places, trial=True)
        self.fleet.attempt_failed(session.run_id, failed)
        if retrying:
            self._recovering[trial.trial_id] = attempt + 1

    def reported(self, trial_id: str) -> None:
        """A result of the trial: after a retry, its first says which attempt recovered."""
        attempt = self._recovering.pop(trial_id, None)
        session = self.sessions.get(trial_id)
        if attempt is not None and session is not None:
            self.fleet.attempt_recovered(session.run_id, attempt)

    def end(self, trial_id: str, exit_code: int) -> None:
        """Start ending ``trial_id``'s run with ``exit_code``; returns at once (a run already
        ending is left be: only the first end counts)."""
        session = self.sessions.get(trial_id)
        if session is None or session.finishing:
            return
        session.finish(exit_code)
        # Once the fleet has taken the run's end (its last read of the Train run's finished ranks).
        self.marks.clear(trial_id, after=session.retired, within=session.finish_timeout_s + FLEET_SLACK_S)

    def end_all(self, upload_timeout: float) -> None:
        """Wait for every run's end (uploads bounded by ``upload_timeout``), then stop the fleet."""
        deadline = time.monotonic() + upload_timeout
        for session in list(self.sessions.values()):
            if session.primary.creating:  # never created (W&B unreachable): nothing to wait for
                session.primary.wait_done(UNCREATED_WAIT_S, why="its run is still being created (is W&B reachable?)")
            else:
                session.primary.wait_done(max(0.1, deadline - time.monotonic()))
        self.fleet.shutdown(self.options.finish_timeout_s)
        self.marks.close(self.options.finish_timeout_s)
        self.sessions.clear()


class TrialMarks:
    """Each trial's mark in Ray's key-value store (see ``_handoff``): set on the hook, since a
    Train run inside the trial reads it as it starts; cleared on a thread of its own, so that
    a trial's end waits for no GCS call. A trial marked again (a retry) keeps its new mark."""

    def __init__(self, warner: Warner) -> None:
        self._warner = warner
        self._lock = threading.Lock()  # a clear's check and delete against a new mark
        # (trial id, what to wait for first and how long at most); None: stop
        self._to_clear: queue.SimpleQueue[tuple[str, threading.Event | None, float] | None] = queue.SimpleQueue()
        self._pending: set[str] = set()
        self._thread: threading.Thread | None = None

    def mark(self, trial_id: str, run_id: str) -> None:
        with self._lock:
            self._pending.discard(trial_id)
            try:
                _handoff.mark_trial(trial_id, _handoff.TrialMark(run_id))
            except Exception as e:  # noqa: BLE001
                self._warner.warn("handoff", f"Train runs inside trials cannot join their trial's run ({describe(e)})")

    def clear(self, trial_id: str, after: threading.Event | None = None, within: float = 0.0) -> None:
        """Clear ``trial_id``'s mark, once ``after`` is set (at most ``within`` seconds from now)."""
        with self._lock:
            self._pending.add(trial_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-tune-marks", daemon=True)
                self._thread.start()
        self._to_clear.put((trial_id, after, time.monotonic() + within))

    def close(self, timeout: float) -> None:
        """Clear what is left to clear (bounded by ``timeout``) and stop the thread."""
        if self._thread is not None:
            self._to_clear.put(None)
            self._thread.join(timeout)

    def _main(self) -> None:
        while (item := self._to_clear.get()) is not None:
            trial_id, after, until = item
            if after is not None:
                after.wait(max(0.0, until - time.monotonic()))
            with self._lock:
                if trial_id not in self._pending:  # marked again since
                    continue
                self._pending.discard(trial_id)
                try:
                    _handoff.clear_trial(trial_id)
                except Exception:  # noqa: BLE001 - a mark left behind only names a finished trial
                    pass


class TrialHealth(HealthMonitor):
    """A trial's node health. Trials are often seconds long, and a table's end is its run's end:
    W&B makes each table an artifact that the run's finish uploads, and the experiment's end waits
    for the last trials' finish. So a trial's run logs its ``nodes`` table while the trial runs:
    once its nodes are known, again as each has sampled or a node's state changed (and, as every
    run, every ``table_every_s``); its end logs one only when a node's state changed since the last."""

    _shown: tuple[frozenset[tuple[str, NodeState]], frozenset[str]] | None = None

    def tick(self, now: float | None = None, final: bool = False) -> TickResult:
        out = super().tick(now, final=final)
        nodes = self.nodes()
        shape = (frozenset((n.node_id, n.state) for n in nodes), frozenset(n.node_id for n in nodes if n.sampled))
        if out.table is not None:
            if final and not out.alerts and self._shown is not None and shape[0] == self._shown[0]:
                out.table = out.gpu_table = None  # the end says what the last table said
        elif nodes and shape != self._shown and not final:
            out.table = self.table(now)
            out.gpu_table = self.gpu_table()
            out.stragglers = len(self.straggler_nodes())
        if out.table is not None:
            self._shown = shape
        return out


def trial_gpus(place: _ray.ActorPlace) -> dict[str, Any]:
    """What the health rules learn of a trial's GPUs (``set_run_nodes``'s ``ranks`` and
    ``rank_gpus``): a trial holding GPUs is rank 0 of its node and is judged by those GPUs (as
    Ray's slots there, named on the node: ``GpuSlots``); one holding none, or whose GPUs cannot be
    read, says nothing, and its node is judged by every GPU (a Train run inside it may use them)."""
    if not place.gpu_slots:
        return {}
    return {"ranks": {place.node_id: (0,)}, "rank_gpus": {0: GpuSlots(place.gpu_slots)}}


def _new_config_only(rows: RowBuilder) -> RowBuilder:
    """``rows`` for one run, with the config it returns cut to what changed since the last row
    (Tune's auto-filled keys come with every result; wandb sends each config update on)."""
    sent: dict[str, Any] = {}

    def build(result: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        row, config, skipped = rows(result)
        new = {k: v for k, v in config.items() if k not in sent or not _same(sent[k], v)}
        sent.update(new)
        return row, new, skipped

    return build


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - an array, say: sent again
        return False


def _with_settings(spec: WriterSpec, settings: dict[str, Any]) -> WriterSpec:
    return replace(spec, settings=settings)


def _node_writer_spec(primary: RunWriter, node: NodeInfo, process: RunProcess | None) -> WriterSpec:
    """The spec of a trial's node writer on ``node`` (on the fleet thread): its ``proc.*`` series
    follow the trial's process (``process``, as its primary's thread located it) on the trial's node."""
    spec = node_spec(primary.spec, label=node.label, entity=primary.entity, project=primary.project)
    settings = {k: v for k, v in spec.settings.items() if k not in ("x_disable_stats", "x_stats_pid")}
    if process is not None and process.node_id == node.node_id and process.pid:
        settings["x_stats_pid"] = process.pid  # proc.* series describe the trial's process
    return _with_settings(spec, settings)


class TrialRelayed:
    """A trial's run's ``relay`` (called on the fleet thread only, every poll of the run and at its
    end): what the Train run inside the trial published through the hand-off, as the fleet's
    :class:`Relayed`: its nodes and ranks, their attempt, its hang setting and the attempt's state
    (the ranks that finished, where it last checkpointed), and its failed attempts and recoveries.
    The hang setting is read once the Train run has ranks, and kept (it publishes it as it starts,
    before its workers)."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
        self._hangs: HangSetting | None = None

    def __call__(self) -> Relayed:
        workers = _handoff.trial_workers(self.trial_id)
        ranks = workers.ranks()
        if not ranks:
            return Relayed(ranks)
        if self._hangs is None:
            self._hangs = _handoff.hang_setting(self.trial_id)
        failures = _handoff.trial_failures(self.trial_id).events
        if self._hangs is None:  # its ranks still watched for how they end
            return Relayed(ranks, workers.attempt, failures=failures)
        attempt = _handoff.attempt_state(self.trial_id)
        return Relayed(ranks, workers.attempt, self._hangs, attempt.finished, attempt.checkpoint_reports, failures)
