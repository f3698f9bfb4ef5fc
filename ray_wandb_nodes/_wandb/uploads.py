"""Checkpoint artifacts of a run's primary, or of a node logger's run (the node strategy),
built on a thread of their own.

Building an artifact reads every file of the checkpoint for its digest; on the primary's
writer thread a multi-GB checkpoint would hold up every row, table and alert behind it. So
the artifact thread builds each in turn and hands it back; the writer thread logs it (wandb's
run belongs to that thread), and a watch thread waits for wandb's answer, so that a version
W&B did not commit (its files vanished: Ray's ``num_to_keep``) is one warning, never silent.
An abort stops all three at once. A node logger's run has no writer thread: its artifacts are
logged on the artifact thread as they are built (``drain`` before the run's finish).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._warn import Warner, describe
from .artifacts import CheckpointGoneError


@dataclass(frozen=True)
class Upload:
    """One checkpoint on its way to W&B: the artifact's name, its aliases, the checkpoint's
    index among the run's (0: the first) and its path, for the warnings."""

    name: str
    aliases: tuple[str, ...]
    index: int
    where: str = ""

    def skipped(self, why: str, gone: bool) -> str:
        """The one warning of a checkpoint W&B holds no version of (pure)."""
        where = self.where or "no path"
        text = f"checkpoint {self.index} ({where}) is not a version of the artifact {self.name}: {why}"
        if gone:  # the fix for Ray's deletion
            text += (
                "; Ray deleted it before its upload ended (CheckpointConfig(num_to_keep=...)), so W&B keeps no "
                "version of it and 'latest' stays on the last whole one; raise num_to_keep or checkpoint less often"
            )
        return text


# What the artifact thread hands to the writer thread: (artifact, upload).
Hand = Callable[[Any, Upload], None]


class ArtifactUploads:
    """One run's checkpoint artifacts: built off the writer thread, logged on it, watched until
    W&B commits them, each named in warnings, with what was dropped and what was last handed
    to wandb for an abort to say."""

    def __init__(self, hand: Hand, ended: threading.Event, warner: Warner) -> None:
        """``hand`` gives a built artifact to the writer thread; ``ended`` is set once the run has
        ended, after which the artifact thread stops when it has nothing left to build."""
        self._hand = hand
        self._ended = ended
        self._warner = warner
        self._builds: queue.SimpleQueue[tuple[Callable[[Any], Any], Upload]] = queue.SimpleQueue()
        self._builder: threading.Thread | None = None
        self._watches: queue.SimpleQueue[tuple[Any, Upload]] = queue.SimpleQueue()  # (None, _): the end
        self._watcher: threading.Thread | None = None
        self._counts: dict[str, int] = {}  # checkpoints added, by artifact name
        # Those not handed to wandb yet, and the last one that was.
        self._unlogged: list[Upload] = []
        self._last_logged: str | None = None
        self._abandoned = threading.Event()  # an abort: build and log no more, finish at once
        self._lock = threading.Lock()

    # from hooks: never blocks on W&B ---------------------------------------------------------
    def add(self, make: Callable[[Any], Any], aliases: Sequence[str], name: str, where: str = "") -> None:
        """Build ``make(wandb)`` on the artifact thread (started on first use); ``where`` is the
        checkpoint's path, for the warnings."""
        with self._lock:
            upload = Upload(name, tuple(aliases), self._counts.get(name, 0), where)
            self._counts[name] = upload.index + 1
            self._unlogged.append(upload)
            if self._builder is None:
                self._builder = threading.Thread(target=self._build, name="ray_wandb_nodes-artifacts", daemon=True)
                self._builder.start()
        self._builds.put((make, upload))

    def abandon(self) -> tuple[list[str], str | None]:
        """Build and log no more. Returns the names not handed to wandb (dropped) and the last one
        that was (wandb may still be uploading it)."""
        self._abandoned.set()
        with self._lock:
            return [u.name for u in self._unlogged], self._last_logged

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    @property
    def pending(self) -> bool:
        """Whether some artifact is still being built or waits to be logged."""
        with self._lock:
            return bool(self._unlogged)

    # on the writer thread --------------------------------------------------------------------
    def log(self, run: Any, artifact: Any, upload: Upload) -> None:
        """Log a built artifact to ``run`` (not after an abort), then watch its upload; a failure
        is one warning."""
        try:
            if not self._abandoned.is_set():
                logged = run.log_artifact(artifact, aliases=list(upload.aliases) or None)
                self._last_logged = upload.name
                if not getattr(run, "offline", False):  # offline, wandb uploads nothing until a sync
                    self._watch(logged, upload)
        except Exception as e:  # noqa: BLE001
            self._failed(e)
        self.settled(upload)

    def settled(self, upload: Upload) -> None:
        """``upload`` is logged, failed or dropped: no longer pending."""
        with self._lock:
            if upload in self._unlogged:
                self._unlogged.remove(upload)

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` until every artifact added is logged or dropped, then let the
        artifact thread stop once idle: for a ``hand`` that logs on the artifact thread itself
        (a node writer's, in its logger actor), before the run's finish."""
        deadline = time.monotonic() + timeout
        while self.pending and not self._abandoned.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._ended.set()

    def finished(self, timeout: float) -> None:
        """After the run's finish (wandb has answered every upload by then): wait up to
        ``timeout`` for the watch thread to say which versions W&B did not commit."""
        with self._lock:
            watcher = self._watcher
        if watcher is not None:
            self._watches.put((None, Upload("", (), -1)))  # the end: no more to watch
            watcher.join(timeout)

    # the artifact thread ---------------------------------------------------------------------
    def _build(self) -> None:
        """Build each artifact in turn and hand it to the writer thread."""
        import wandb

        while True:
            try:
                make, upload = self._builds.get(timeout=1.0)
            except queue.Empty:
                with self._lock:
                    if self._ended.is_set() and self._builds.empty():  # the run has ended
                        self._builder = None
                        return
                continue
            artifact = None
            if not self._abandoned.is_set():
                try:
                    artifact = make(wandb)
                except CheckpointGoneError as e:
                    self._skipped(upload, str(e), gone=True)
                except Exception as e:  # noqa: BLE001
                    self._failed(e)
            if artifact is None:
                self.settled(upload)
            else:
                self._hand(artifact, upload)

    # the watch thread ------------------------------------------------------------------------
    def _watch(self, logged: Any, upload: Upload) -> None:
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._wait, name="ray_wandb_nodes-uploads", daemon=True)
                self._watcher.start()
        self._watches.put((logged, upload))

    def _wait(self) -> None:
        """Wait for wandb's answer on each logged artifact, in turn: it answers once the upload
        has ended, committed or not (wandb never times an upload out, so neither does this)."""
        while True:
            logged, upload = self._watches.get()
            if logged is None:
                with self._lock:
                    self._watcher = None
                return
            try:
                logged.wait()
            except Exception as e:  # noqa: BLE001 - the upload failed, or wandb went away
                if not self._abandoned.is_set():  # an abort has its own warning
                    gone = bool(upload.where) and not os.path.isdir(upload.where)
                    self._skipped(upload, f"W&B did not commit its upload ({describe(e)})", gone=gone)

    def _skipped(self, upload: Upload, why: str, gone: bool) -> None:
        self._warner.warn(f"artifact-skipped:{upload.name}:{upload.index}", upload.skipped(why, gone))

    def _failed(self, e: BaseException) -> None:
        self._warner.warn(
            f"artifact:{type(e).__name__}", f"a checkpoint could not be logged as an artifact ({describe(e)})"
        )
