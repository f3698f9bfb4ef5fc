"""An attempt's folder on a node: where its ranks' beacons and dump files live, and for how long.

A folder is named by its attempt's key (:func:`attempt_key`): the run id, the attempt's number and
a token the driver side draws once a job, so two jobs running at once with one run name and
storage path never share a folder, and each worker group of a job (a restart) has a new one. The
driver side hands the key to the ranks' arming and to the node loggers; nothing is derived on
both sides. Folders live under ``<root>/ray_wandb_nodes-<uid>/``, private to the user.

What a folder holds lives as long as the processes that wrote it: a rank's files share the stem
``rank-<rank>.<pid>``, and once that process is dead (its pid gone, or taken by a later process,
told apart by the start time its slot records) they are removed by whoever watches the folder
(:func:`remove_dead`). The folder itself goes when its attempt is over and nothing live is left
in it (:func:`remove_if_dead`), and a watcher refreshes a lease in it (:func:`touch`) so that a
node logger starting later (:func:`sweep_stale`) removes only folders nobody watched for
``STALE_S`` whose processes are all dead: never a live job's, whichever job or Tune trial it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Collection
from pathlib import Path

from .beacon import default_root
from .slot import HEADER, HEADER_AT, MAGIC, SLOT_SIZE, SUFFIX, alive

LEASE = ".watched"  # touched by whoever watches the folder (its node's logger, or the controller)
STALE_S = 600.0  # a folder nobody watched for this long, with no live process, is left over
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_STEM = re.compile(r"^rank-(\d+)\.(\d+)\.")  # rank-<rank>.<pid>.<what>: every file of a rank's process
_RUN_ID_CHARS = 96  # of the key: a file name stays well under 255 bytes with the token and a rank's names


def new_token() -> str:
    """A job's token: 8 hex digits drawn once by the driver side (32 bits: two jobs of one run
    name and storage path on one node draw the same one about once in four billion pairs)."""
    return secrets.token_hex(4)


def attempt_key(run_id: str, number: int, token: str) -> str:
    """The key (and folder name) of attempt ``number`` of ``run_id`` in the job that drew ``token``:
    ``<run id>.a<number>.<token>``, its run id cut to what a file name can hold."""
    safe = _UNSAFE.sub("_", run_id)[:_RUN_ID_CHARS] or "run"
    return f"{safe}.a{number}.{token}"


def base_dir(root: Path | None = None) -> Path:
    """This user's folder of attempt folders on this node (``/dev/shm`` where it exists)."""
    return (Path(root) if root is not None else default_root()) / f"ray_wandb_nodes-{os.getuid()}"


def run_dir(key: str, root: Path | None = None) -> Path:
    """The folder of the attempt ``key`` (:func:`attempt_key`) on this node, private to this user."""
    return base_dir(root) / (_UNSAFE.sub("_", key) or "run")


def touch(folder: Path) -> None:
    """Say that ``folder`` is watched (its lease, for :func:`sweep_stale`); nothing where it is gone."""
    with contextlib.suppress(OSError):
        (Path(folder) / LEASE).touch(mode=0o600, exist_ok=True)


def _stem_alive(folder: Path, rank: int, pid: int) -> bool:
    """Whether the process that wrote the files ``rank-<rank>.<pid>.*`` lives: the start time its
    slot records tells it from a later process that reuses the pid; without a slot (the rank
    disarmed, or a slot of another version), the pid alone."""
    started = 0
    try:
        with open(folder / f"rank-{rank}.{pid}{SUFFIX}", "rb") as f:
            raw = f.read(SLOT_SIZE)
        if len(raw) == SLOT_SIZE:
            magic, _, _, _, slot_pid, _, proc_start, _ = HEADER.unpack_from(raw, HEADER_AT)
            if magic == MAGIC and slot_pid == pid:
                started = proc_start
    except OSError:
        pass
    return alive(pid, started)


def _stems(folder: Path) -> dict[tuple[int, int], list[Path]]:
    """Every rank process's files in ``folder``, by (rank, pid)."""
    out: dict[tuple[int, int], list[Path]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        match = _STEM.match(name)
        if match:
            out.setdefault((int(match.group(1)), int(match.group(2))), []).append(Path(folder) / name)
    return out


def rank_processes(folder: Path) -> set[tuple[int, int]]:
    """The ``(rank, pid)`` of every rank process with a file in ``folder`` (its slot, a record of
    its end, its mark): what a node watches of an attempt's ranks, with or without their beacons."""
    return set(_stems(Path(folder)))


def remove_dead(
    folder: Path, ranks: Collection[int] | None = None, only: Collection[tuple[int, int]] | None = None
) -> tuple[int, int]:
    """Remove the files of ``folder``'s dead processes (of ``ranks`` only, when given: a node
    removes its own ranks' files, as nodes that share a host's ``/dev/shm`` see each other's; of
    the ``(rank, pid)`` in ``only``, when given: the processes whose end the node's death watch
    has read, so that no record goes before it is read); returns (processes removed, live
    processes seen)."""
    removed = live = 0
    for (rank, pid), paths in _stems(Path(folder)).items():
        if ranks is not None and rank not in ranks:
            continue
        if only is not None and (rank, pid) not in only:
            continue
        if _stem_alive(Path(folder), rank, pid):
            live += 1
            continue
        removed += 1
        for path in paths:
            with contextlib.suppress(OSError):
                path.unlink()
    return removed, live


def remove_if_dead(folder: Path) -> bool:
    """An attempt that is over: the files of its dead processes removed, then the folder itself
    once no process of it lives; whether the folder is gone."""
    folder = Path(folder)
    if not folder.exists():
        return True
    _, live = remove_dead(folder)
    if live:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def _last_watched(folder: Path) -> float:
    """When ``folder`` was last watched or written (its lease, or the folder's own change time)."""
    times = []
    for path in (folder / LEASE, folder):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times, default=0.0)


def sweep_stale(
    root: Path | None = None, keep: Collection[str] = (), stale_s: float = STALE_S, now: float | None = None
) -> list[str]:
    """The janitor of this user's attempt folders on this node: remove each folder that is not in
    ``keep`` (watched here), that nobody watched for ``stale_s`` (its lease and the folder
    unchanged: every watcher refreshes the lease far more often) and in which no process lives.
    A live job's folder is kept on either count: its watcher's lease, or its live ranks. Returns
    the keys removed."""
    base = base_dir(root)
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return removed
    for key in entries:
        folder = base / key
        if key in keep or not folder.is_dir() or now - _last_watched(folder) < stale_s:
            continue
        if remove_if_dead(folder):
            removed.append(key)
    return removed
