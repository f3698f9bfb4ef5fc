"""Offline collection: each node writer's offline run brought to the run's folder at its end.

The collection keeps which offline runs each node hosted (so that a logger that was replaced
still has its runs collected) and which runs are being collected where (no new writer of that
run there meanwhile). At a run's end it brings every node's run over in parallel, one thread a
node, bounded by a deadline: through the run's storage when there is one (a node or driver side
that cannot use it falls back to Ray), else through Ray in chunks. Every node ends up named in
the run's index: collected, empty, left on its node (and where), or lost with its node.

An online run's nodes that had no route to W&B (``egress.py``) wrote offline runs too: theirs
come to the run's ``fallback`` folder the same way, and each is synced into the online run as it
arrives (``_wandb.sync``), within the same deadline; a node's run that could not be synced in time
stays in the folder, and one warning gives the command that syncs it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .._wandb.sync import SyncInto, sync_folder
from .._wandb.writers import Role
from .._warn import Warner, describe
from ..offline.index import OfflineIndex, node_local_dir
from ..offline.storage import StorageSpot, fetch, remove, remove_folder_if_empty
from ..offline.transfer import MAX_COLLECT_BYTES, receive
from .node_offline import PackedRun
from .nodes import NodeInfo
from .pool import LoggerHandle

SYNCS = 4  # wandb sync processes at once on the driver side (each a Python and a wandb-core)


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (monotonic), at least 0.1: a bound for one Ray call."""
    return max(0.1, deadline - time.monotonic())


@dataclass
class CollectJob:
    """One run's offline data to bring over: where to, how, and from which nodes."""

    run_id: str
    index: OfflineIndex
    role: Role  # of its writers on the nodes: NODE (joined a shared run) or RUN
    storage: StorageSpot | None = None
    sources: list[LoggerHandle] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    deadline: float = 0.0
    recorded: set[str] = field(default_factory=set)  # labels whose index entry a collector wrote
    # An online run's: each node's offline run, once here, is synced into it (its nodes had no route).
    sync: SyncInto | None = None
    synced: set[str] = field(default_factory=set)  # labels synced into the run

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self.threads) and time.monotonic() < self.deadline


class OfflineCollection:
    def __init__(self, warner: Warner) -> None:
        self._warner = warner
        # node id -> offline runs that had a writer there and are not collected yet
        self._hosted: dict[str, set[str]] = {}
        # run id -> nodes whose offline data is being collected
        self.collecting: dict[str, set[str]] = {}
        self._syncs = threading.BoundedSemaphore(SYNCS)
        self._online: set[str] = set()  # online runs whose nodes without a route to W&B wrote offline

    def hosted_offline(self, node_id: str, run_id: str) -> None:
        """A writer of the online run ``run_id`` on ``node_id`` writes offline (no route to W&B)."""
        self._online.add(run_id)
        self.hosted(node_id, run_id)

    def hosted(self, node_id: str, run_id: str) -> None:
        """A writer of the offline run ``run_id`` started on ``node_id``."""
        self._hosted.setdefault(node_id, set()).add(run_id)

    def job(
        self,
        run_id: str,
        index: OfflineIndex,
        role: Role,
        storage: StorageSpot | None,
        handles: list[LoggerHandle],
        sync: SyncInto | None = None,
    ) -> CollectJob:
        """The job of bringing ``run_id`` over from the nodes (of ``handles``) that hosted it
        (``sync``: into the online run as each arrives)."""
        sources = [h for h in handles if run_id in self._hosted.get(h.node.node_id, ())]
        return CollectJob(run_id=run_id, index=index, role=role, storage=storage, sources=sources, sync=sync)

    def start(self, job: CollectJob, timeout: float) -> None:
        """Bring each node's offline run to the run's folder, in parallel, within ``timeout``."""
        job.deadline = time.monotonic() + timeout
        self.collecting.setdefault(job.run_id, set()).update(h.node.node_id for h in job.sources)
        job.threads = [
            threading.Thread(
                target=self.collect,
                args=(job, h),
                name=f"ray_wandb_nodes-collect-{h.node.label}",
                daemon=True,
            )
            for h in job.sources
        ]
        for t in job.threads:
            t.start()

    def end(self, job: CollectJob) -> None:
        """Name, in the index, every node whose offline run was not brought over in time."""
        for h in job.sources:
            if h.node.label not in job.recorded:
                error = "the run ended before its offline run was brought over"
                self.leave_on_node(h.node, job.run_id, job.index, job.role, error)
        for h in job.sources:
            self._hosted.get(h.node.node_id, set()).discard(job.run_id)
            self.collecting.get(job.run_id, set()).discard(h.node.node_id)
        if not self.collecting.get(job.run_id):
            self.collecting.pop(job.run_id, None)
        if job.storage is not None and not any(t.is_alive() for t in job.threads):
            remove_folder_if_empty(job.storage)
        if job.sync is not None and job.sources and job.synced >= {h.node.label for h in job.sources}:
            shutil.rmtree(job.index.folder, ignore_errors=True)  # every node's series is in the run

    def lost(self, node: NodeInfo, index_of: dict[str, tuple[OfflineIndex, Role]]) -> None:
        """``node`` left the cluster: its offline runs (``index_of``: run id -> index, role)
        stayed on it, and the index says so."""
        for run_id in sorted(self._hosted.get(node.node_id, ())):
            if run_id in index_of:
                index, role = index_of[run_id]
                error = "the node left the cluster; its offline run stayed on it"
                self.leave_on_node(node, run_id, index, role, error, state="lost")

    def leave_on_node(
        self, node: NodeInfo, run_id: str, index: OfflineIndex, role: Role, error: str, state: str = "left-on-node"
    ) -> None:
        """Say, in a warning and in the index, that a node's offline run is not in the folder,
        why, and (unless it is empty) where it stayed."""
        fields: dict[str, Any] = {"state": state, "error": error}
        if state != "empty":
            fields["source"] = f"{node.hostname}:{node_local_dir(run_id, node.label)}"
        where = f"; it is at {fields['source']}" if "source" in fields else ""
        if state != "empty" and run_id in self._online:  # a node without a route: its series are not in the run
            where += " (its series are not in the run: `ray-wandb-nodes sync` it from a machine that reaches W&B)"
        self._warner.warn(
            f"offline:{run_id}:{node.node_id}",
            f"the offline run of {node.label} was not brought to {index.folder} ({error}){where}",
        )
        self._set_writer(index, node, role, **fields)

    def _set_writer(self, index: OfflineIndex, node: NodeInfo, role: Role, **fields: Any) -> None:
        entry = {"role": role.value, "label": node.label, "node_id": node.node_id, "hostname": node.hostname, **fields}
        try:
            index.set_writer(entry)
        except OSError as e:
            self._warner.warn("offline-index", f"the offline index could not be written ({describe(e)})")

    # one node, on its own thread ----------------------------------------------------------------------
    def collect(self, job: CollectJob, handle: LoggerHandle) -> None:
        """Bring one node's offline run over: through the job's storage when it has one (no size
        bound; a node or driver side that cannot use it falls back to Ray), else through Ray."""
        import ray

        node, actor, deadline = handle.node, handle.actor, job.deadline
        dest = os.path.join(job.index.folder, "nodes", node.label)
        try:
            limit = None if job.storage is not None else MAX_COLLECT_BYTES
            packed: PackedRun = ray.get(
                actor.pack_offline.remote(job.run_id, node.label, limit), timeout=_left(deadline)
            )
            if not packed.size:
                error = "the node writer left no offline data"
                self.leave_on_node(node, job.run_id, job.index, job.role, error, state="empty")
                return
            via = "ray"
            if job.storage is not None and self._through_storage(handle, job, packed, dest):
                via = "storage"
            if via == "ray":
                if packed.size > MAX_COLLECT_BYTES or packed.archive is None:
                    if packed.archive is not None:
                        actor.drop_archive.remote(packed.archive)
                    error = f"{packed.size} bytes packed, above the {MAX_COLLECT_BYTES} bytes brought through Ray"
                    self.leave_on_node(node, job.run_id, job.index, job.role, error)
                    return
                archive = packed.archive
                receive(
                    lambda offset: ray.get(actor.read_offline.remote(archive, offset), timeout=_left(deadline)),
                    packed.size,
                    dest,
                    deadline,
                )
        except Exception as e:  # noqa: BLE001 - the data stays on the node; say where
            self.leave_on_node(node, job.run_id, job.index, job.role, describe(e))
            return
        finally:
            job.recorded.add(node.label)
        path = job.index.relative(dest)
        self._set_writer(job.index, node, job.role, state="collected", via=via, path=path, bytes=packed.size)
        if job.sync is not None:
            self._sync(job, node, dest)
        try:
            ray.get(actor.discard_offline.remote(job.run_id, node.label), timeout=_left(deadline))
        except Exception as e:  # noqa: BLE001 - collected; only the node's copy stays
            self._warner.warn(
                f"offline-discard:{job.run_id}:{node.node_id}",
                f"the offline run of {node.label} was brought over, but its copy on the node could not be removed "
                f"({describe(e)})",
            )

    def _sync(self, job: CollectJob, node: NodeInfo, dest: str) -> None:
        """A node's offline run, here now, into the online run (before the job's deadline); what
        could not be synced stays here, and one warning gives the command."""
        assert job.sync is not None
        cut: list[tuple[str, int]] = []  # its logs that ended inside a record, and the bytes cut
        if self._syncs.acquire(timeout=max(0.0, job.deadline - time.monotonic())):
            try:
                error = sync_folder(
                    job.sync, dest, job.deadline, label=node.label, on_cut=lambda log, n: cut.append((log, n))
                )
            finally:
                self._syncs.release()
        else:
            error = "no time was left to sync it"
        ended_inside = {"cut_bytes": sum(n for _, n in cut)} if cut else {}
        if error is None:
            job.synced.add(node.label)
            self._set_writer(job.index, node, job.role, state="synced", **ended_inside)
            shutil.rmtree(dest, ignore_errors=True)
            return
        fields = {"path": job.index.relative(dest), "error": error, **ended_inside}
        self._set_writer(job.index, node, job.role, state="collected", **fields)
        self._warner.warn(
            f"offline-sync:{job.run_id}:{node.node_id}",
            f"the series of {node.label} (no route to W&B) were brought to {job.index.folder} but not synced into "
            f"the W&B run {job.run_id} ({error}); sync them with: ray-wandb-nodes sync {job.index.folder}",
        )

    def _through_storage(self, handle: LoggerHandle, job: CollectJob, packed: PackedRun, dest: str) -> bool:
        """The node copies its archive into the storage and the driver side fetches it: True.

        False to go through Ray instead (the node could not write there, or the driver side
        could not read what it wrote: a path that is not shared); raises once the deadline has
        passed, as nothing is left for Ray then. No copy stays in the storage either way.
        """
        import ray

        node, storage, deadline = handle.node, job.storage, job.deadline
        assert storage is not None
        written = False  # True once the node may have written: it removes what it wrote on failure
        try:
            # A duration, timed on the node: never a driver-side timestamp set against its clock.
            seconds = max(0.0, deadline - time.monotonic())
            ref = handle.actor.put_offline.remote(packed.archive, storage, node.label, seconds)
            written = True
            ray.get(ref, timeout=_left(deadline))
            fetch(storage, node.label, packed.size, dest, deadline)
            return True
        except Exception as e:
            if written:  # what the node wrote is where the driver side does not look: the node removes it
                try:
                    ray.get(handle.actor.remove_stored.remote(storage, node.label), timeout=max(_left(deadline), 5.0))
                except Exception:  # noqa: BLE001
                    pass
            if time.monotonic() >= deadline:
                raise
            self._warner.warn(
                f"offline-storage:{job.run_id}:{node.node_id}",
                f"the offline run of {node.label} could not be brought through {storage.uri} "
                f"({describe(e)}); through Ray instead",
            )
            return False
        finally:
            remove(storage, node.label)
