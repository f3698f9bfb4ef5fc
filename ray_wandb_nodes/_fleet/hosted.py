"""What a node logger keeps of each writer it hosts: one record a writer key (a run id, or a run's
observer key), and the pieces a record holds (its checkpoint uploads, the warnings they say)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._egress import Egress
from .._health import ReadProblem, SummaryReader
from .._wandb.metrics import Stepper
from .._wandb.uploads import ArtifactUploads, Upload
from .._wandb.writers import Role, WriterSpec
from .._warn import Warner, describe

EARLY_ROWS = 10_000  # rows kept for a writer not added yet (a restarted actor gets its writers back later)


class Collected(Warner):
    """Warnings said in the actor (on the writer's thread or an upload's), kept for its status:
    the driver side says each once."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._said: dict[str, str] = {}

    def warn(self, key: str, message: str) -> None:
        with self._lock:
            self._said.setdefault(key, message)

    @property
    def said(self) -> dict[str, str]:
        with self._lock:
            return dict(self._said)


def node_uploads(run: Any, warner: Warner, writing: threading.Lock) -> ArtifactUploads:
    """A standalone run's checkpoint artifacts in the actor: each logged on its artifact thread as
    soon as it is built (the actor's calls never wait on a checkpoint being hashed), never while
    the writer thread logs a row (``writing``: wandb's run is used by one thread at a time)."""

    def hand(artifact: Any, upload: Upload) -> None:
        with writing:
            uploads.log(run, artifact, upload)

    uploads = ArtifactUploads(hand, threading.Event(), warner)
    return uploads


@dataclass
class HostedRun:
    """One writer a node logger hosts, from the first row or spec that names it to its finish.

    Changed by the logger's writer calls only (Ray's default concurrency group, one at a time),
    under the logger's lock; its status reads it there, from another thread. Its ``reader`` and
    ``read_error`` are the reading thread's (the sampler's, or a finish's), the reader guarding
    its own state."""

    key: str
    spec: WriterSpec | None = None  # None: rows came before its writer was added
    run: Any = None  # the wandb run, once it joined (or created) its run
    stepper: Stepper | None = None
    error: str | None = None  # why it could not join, log or finish
    logged: int = 0  # history rows logged (a standalone run's)
    early: list[dict[str, Any]] = field(default_factory=list)  # rows that came before the run
    reader: SummaryReader = field(default_factory=SummaryReader)  # its samples, read on the sampler thread
    read_error: ReadProblem | None = None  # its samples or transaction log could not be read
    uploads: ArtifactUploads | None = None  # its checkpoint artifacts (a standalone run's)
    egress: Egress | None = None  # its way to W&B, as its checks found it before it joined

    @property
    def label(self) -> str:
        return self.spec.label if self.spec is not None else ""

    @property
    def role(self) -> Role | None:
        return self.spec.role if self.spec is not None else None

    def problems(self) -> tuple[ReadProblem, ...]:
        """What kept its samples from being read, its reader's and its own."""
        own = (self.read_error,) if self.read_error is not None else ()
        return (*self.reader.read_problems(), *own)


# A writer whose relay died: its finish waits this long more, then goes on (what it logged is in
# its transaction log on its node, which the run's end collects), not for wandb's client to give
# up on the relay (minutes of retries).
RELAY_LOST_FINISH_S = 5.0


def finish_hosted(record: HostedRun, exit_code: int | None, given_up: Callable[[], bool]) -> None:
    """``record``'s wandb finish (with ``exit_code`` where the writer is its own run), on a thread
    of its own: waited for until it returns, or, once ``given_up()`` says the writer's relay died,
    for RELAY_LOST_FINISH_S more. A failed finish is the record's error."""
    run, done = record.run, threading.Event()

    def finish() -> None:
        try:
            if record.role is Role.RUN and exit_code is not None:
                run.finish(exit_code=exit_code)
            else:
                run.finish()
        except Exception as e:  # noqa: BLE001
            record.error = f"finish failed: {describe(e)}"
        finally:
            done.set()

    threading.Thread(target=finish, name="ray_wandb_nodes-finish", daemon=True).start()
    while not done.wait(0.5):
        if given_up():
            done.wait(RELAY_LOST_FINISH_S)  # then on: its series are in its transaction log, collected
            return
