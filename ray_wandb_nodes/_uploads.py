"""Checkpoint artifacts of a run's primary, built on a thread of their own.

Building an artifact reads every file of the checkpoint for its digest; on the primary's
writer thread a multi-GB checkpoint would hold up every row, table and alert behind it. So
the artifact thread builds each in turn and hands it back; the writer thread logs it (wandb's
run belongs to that thread). An abort stops both at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._warn import Warner, describe

# What the artifact thread hands to the writer thread: (artifact, aliases, name).
Hand = Callable[[Any, list[str], str], None]


class ArtifactUploads:
    """One run's checkpoint artifacts: built off the writer thread, logged on it, each named
    in warnings, with what was dropped and what was last handed to wandb for an abort to say."""

    def __init__(self, hand: Hand, ended: threading.Event, warner: Warner) -> None:
        """``hand`` gives a built artifact to the writer thread; ``ended`` is set once the run has
        ended, after which the artifact thread stops when it has nothing left to build."""
        self._hand = hand
        self._ended = ended
        self._warner = warner
        self._builds: queue.SimpleQueue[tuple[Callable[[Any], Any], list[str], str]] = queue.SimpleQueue()
        self._builder: threading.Thread | None = None
        # Names of those not handed to wandb yet, and the last one that was.
        self._unlogged: list[str] = []
        self._last_logged: str | None = None
        self._abandoned = threading.Event()  # an abort: build and log no more, finish at once
        self._lock = threading.Lock()

    # from hooks: never blocks on W&B ---------------------------------------------------------
    def add(self, make: Callable[[Any], Any], aliases: Sequence[str], name: str) -> None:
        """Build ``make(wandb)`` on the artifact thread (started on first use)."""
        with self._lock:
            self._unlogged.append(name)
            if self._builder is None:
                self._builder = threading.Thread(target=self._build, name="ray_wandb_nodes-artifacts", daemon=True)
                self._builder.start()
        self._builds.put((make, list(aliases), name))

    def abandon(self) -> tuple[list[str], str | None]:
        """Build and log no more. Returns the names not handed to wandb (dropped) and the last one
        that was (wandb may still be uploading it)."""
        self._abandoned.set()
        with self._lock:
            return list(self._unlogged), self._last_logged

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    @property
    def pending(self) -> bool:
        """Whether some artifact is still being built or waits to be logged."""
        with self._lock:
            return bool(self._unlogged)

    # on the writer thread --------------------------------------------------------------------
    def log(self, run: Any, artifact: Any, aliases: list[str], name: str) -> None:
        """Log a built artifact to ``run`` (not after an abort); a failure is one warning."""
        try:
            if not self._abandoned.is_set():
                run.log_artifact(artifact, aliases=aliases or None)
                self._last_logged = name
        except Exception as e:  # noqa: BLE001
            self._failed(e)
        self.settled(name)

    def settled(self, name: str) -> None:
        """``name`` is logged, failed or dropped: no longer pending."""
        with self._lock:
            if name in self._unlogged:
                self._unlogged.remove(name)

    # the artifact thread ---------------------------------------------------------------------
    def _build(self) -> None:
        """Build each artifact in turn and hand it to the writer thread."""
        import wandb

        while True:
            try:
                make, aliases, name = self._builds.get(timeout=1.0)
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
                except Exception as e:  # noqa: BLE001
                    self._failed(e)
            if artifact is None:
                self.settled(name)
            else:
                self._hand(artifact, aliases, name)

    def _failed(self, e: BaseException) -> None:
        self._warner.warn(
            f"artifact:{type(e).__name__}", f"a checkpoint could not be logged as an artifact ({describe(e)})"
        )
