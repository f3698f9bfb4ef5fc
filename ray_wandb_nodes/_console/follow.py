"""Following a rank's log files on its node: found by the rank's process id, read in chunks.

Ray writes each worker process's stdout and stderr to files of the node's session folder,
``<session>/logs/worker-<worker id>-<job id>-<pid>.out`` and ``.err`` (no job id part for a
worker not yet bound to a job). So it is from Ray 2.50 to 2.60: the core worker creates them
(``ray/_private/workers/default_worker.py``, ``get_worker_log_file_name`` in
``ray/_private/ray_logging/__init__.py``), and the process's file descriptors 1 and 2 point at
them. Nothing here touches the rank's process or its descriptors.

What happens to those files, and what a follower does about it:

- **The process dies**: the files stay. Ray's log monitor moves a dead worker's files into
  ``logs/old/`` (``LogMonitor._close_all_files``), a rename on one file system: the open
  descriptor keeps reading the same file to its end, so a dead rank's last lines are read.
- **Rotation** (``RAY_ROTATION_MAX_BYTES`` set for the workers): the worker then writes through
  a pipe to a rotating sink of its core worker, which renames the file to ``<name>.out.1`` (the
  one before to ``.out.2``, ...; seen on 2.60) and opens a new one at the same path. A follower
  reads its open file to the end, sees another file at the path (a different inode) and goes on
  there from its start. More than one rotation between two reads loses the files in between
  (at the default poll of 0.5 s: over ``RAY_ROTATION_MAX_BYTES`` twice in half a second).
- **Truncation** in place (the file got shorter than what was read): read again from its start.
- **Far behind** (over :data:`MAX_BACKLOG` unread): jump to :data:`KEEP_BYTES` before the end
  and say how much was skipped, so a rank printing faster than it can be read costs a bounded
  read, never an unbounded one.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import NamedTuple

from .lines import Stream

READ_BYTES = 64 << 10  # one read
POLL_BYTES = 1 << 20  # at most this much of one file per read() call
MAX_BACKLOG, KEEP_BYTES = 8 << 20, 256 << 10
TAIL_BYTES = 32 << 10  # of a dead worker's files, for its last words: NCCL's watchdog prints a few lines
SUFFIX = {Stream.ERR: "err", Stream.OUT: "out"}  # stderr first: see rank.py's EchoFilter


def worker_files(logs_dir: str | os.PathLike[str], pid: int) -> dict[Stream, Path]:
    """The stdout and stderr files of worker process ``pid`` in a session's ``logs`` folder (or its
    ``old/`` folder, once the process is dead); a stream without a file is left out. Where a pid
    was used twice in one session, the newest file is the one."""
    found: dict[Stream, Path] = {}
    for stream, suffix in SUFFIX.items():
        for folder in (Path(logs_dir), Path(logs_dir) / "old"):
            matches = glob.glob(os.path.join(glob.escape(str(folder)), f"worker-*-{pid}.{suffix}"))
            if matches:
                found[stream] = Path(max(matches, key=_mtime))
                break
    return found


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


class Chunk(NamedTuple):
    """What one read of a file gave: ``skipped`` bytes jumped over, then ``data``."""

    data: bytes
    skipped: int = 0


class FileFollower:
    """One file, followed from its start (or its end) across rotation and truncation."""

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._pos = 0
        self._from_end = from_end
        self.rotations = 0
        self.truncations = 0

    def read(self, limit: int = POLL_BYTES) -> Chunk:
        """New bytes since the last read, at most ``limit`` of them."""
        if self._fd is None and not self._open():
            return Chunk(b"")
        assert self._fd is not None
        parts: list[bytes] = []
        skipped = 0
        size = os.fstat(self._fd).st_size
        if size < self._pos:
            self.truncations += 1
            self._pos = 0
        if size - self._pos > MAX_BACKLOG:
            skipped = size - KEEP_BYTES - self._pos
            self._pos = size - KEEP_BYTES
        got = self._drain(parts, limit)
        if got < limit and self._pos >= os.fstat(self._fd).st_size and self._rotated():
            got += self._drain(parts, limit - got)
        return Chunk(b"".join(parts), skipped)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def behind(self) -> int:
        """Bytes written and not yet read (of the open file)."""
        if self._fd is None:
            return 0
        return max(os.fstat(self._fd).st_size - self._pos, 0)

    def _drain(self, parts: list[bytes], limit: int) -> int:
        assert self._fd is not None
        got = 0
        while got < limit:
            data = os.pread(self._fd, min(READ_BYTES, limit - got), self._pos)
            if not data:
                break
            parts.append(data)
            self._pos += len(data)
            got += len(data)
        return got

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return False
        st = os.fstat(fd)
        self._fd, self._ident = fd, (st.st_dev, st.st_ino)
        self._pos = st.st_size if self._from_end else 0
        self._from_end = False  # a file that replaces this one is read from its start
        return True

    def _rotated(self) -> bool:
        """Whether another file is at the path now; if so, it is open from its start."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # moved to old/, or removed: the open file is still the rank's
        if (st.st_dev, st.st_ino) == self._ident:
            return False
        self.close()
        if not self._open():
            return False
        self.rotations += 1
        return True


def log_tail(logs_dir: str | os.PathLike[str], pid: int, nbytes: int = TAIL_BYTES) -> str:
    """The last ``nbytes`` of worker process ``pid``'s stderr, then its stdout (each decoded,
    invalid bytes replaced): what a dead rank printed last, for its node to read how it ended."""
    parts = []
    for path in worker_files(logs_dir, pid).values():
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - nbytes))
                parts.append(f.read(nbytes).decode("utf-8", errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)
