"""Offline runs: one folder per W&B run on the driver side, with every node's data in it.

Shared mode cannot be offline, so in offline mode every writer writes an offline run of its
own under the run's id, labelled as in shared mode. The primary writes straight into the
run's folder; a node writer writes into its node's temp folder and, at the end, its data is
packed (tar.gz), brought to the driver side (through Ray in bounded chunks, or through the
run's storage: see :func:`storage_spot`) and unpacked next to the primary's::

    <dir>/ray_wandb_nodes/<run id>/
        index.json                                   the run, its writers, labels and paths
        primary/wandb/offline-run-<time>-<id>/       the primary's offline run
        nodes/<label>/wandb/offline-run-<time>-<id>/ one per node writer

``ray-wandb-nodes report`` and ``ray-wandb-nodes sync`` read such a folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

INDEX = "index.json"
INDEX_FORMAT = "ray_wandb_nodes.offline/1"
CHUNK_BYTES = 4 << 20
MAX_COLLECT_BYTES = 2 << 30  # a node's packed offline run above this stays on its node


def offline_folder(base: str, run_id: str) -> str:
    return os.path.join(base, "ray_wandb_nodes", run_id)


def node_local_dir(run_id: str, label: str) -> str:
    """Where a node writer of an offline run writes, on its node (the same path after a restart)."""
    return os.path.join(tempfile.gettempdir(), "ray_wandb_nodes", "offline", run_id, label)


def make_private_dir(path: str) -> None:
    """Create ``path`` readable by this user only (node temp folders are shared with others)."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def read_index(folder: str) -> dict[str, Any] | None:
    """``folder``'s ``index.json``, None when there is none; ``OSError``/``ValueError`` when it
    cannot be read as JSON."""
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


_INDEXES: dict[str, OfflineIndex] = {}
_INDEXES_LOCK = threading.Lock()


def open_index(folder: str, *, run_id: str, project: str | None, name: str | None, group: str | None) -> OfflineIndex:
    """The one index object of ``folder`` in this process (a restarted trial or a second fit of
    one run writes to the same folder); it starts from the index already on disk, if any."""
    key = os.path.realpath(folder)
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = _INDEXES[key] = OfflineIndex(folder, run_id=run_id, project=project, name=name, group=group)
        return index


class OfflineIndex:
    """``index.json`` of one offline run folder; written atomically after every change.

    Build it with :func:`open_index`, so that one object per folder writes the file.
    """

    def __init__(self, folder: str, *, run_id: str, project: str | None, name: str | None, group: str | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {
            "format": INDEX_FORMAT,
            "run_id": run_id,
            "project": project,
            "entity": None,
            "name": name,
            "group": group,
            "exit_code": None,
            "worker_nodes": [],
            "writers": [],
        }
        try:
            on_disk = read_index(folder) or {}
        except (OSError, ValueError):
            on_disk = {}
        if on_disk.get("run_id") == run_id:
            self.data.update({k: v for k, v in on_disk.items() if k != "updated"})

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.data.update(fields)
            self._write()

    def set_writer(self, entry: dict[str, Any]) -> None:
        """Add or replace the entry of one writer (by label and role)."""
        with self._lock:
            writers = [
                w
                for w in self.data["writers"]
                if (w.get("label"), w.get("role")) != (entry.get("label"), entry.get("role"))
            ]
            writers.append(entry)
            writers.sort(key=lambda w: (w.get("role") != "primary", str(w.get("label"))))
            self.data["writers"] = writers
            self._write()

    def relative(self, path: str) -> str:
        return os.path.relpath(path, self.folder)

    def _write(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{INDEX}.", dir=self.folder)
        with os.fdopen(fd, "w") as f:
            json.dump({**self.data, "updated": time.time()}, f, indent=2, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(self.folder, INDEX))


# on the node ---------------------------------------------------------------------------------
def pack(folder: str) -> tuple[str, int]:
    """Pack ``folder`` into a tar.gz beside it; (archive path, size in bytes).

    Links are left out: wandb links ``latest-run`` and its logs to files outside the run
    (wandb-core's shared log), which are not the run's data. Level 1: on wandb's transaction
    logs it packs 3.3x faster than level 6 for an archive 1.22x the size, and packing, not the
    transfer, is what takes the time (``bench/offline_collect.py``).
    """
    archive = folder.rstrip(os.sep) + ".tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(folder, arcname=".", filter=lambda m: None if m.issym() or m.islnk() else m)
    os.chmod(archive, 0o600)
    return archive, os.path.getsize(archive)


def read_chunk(path: str, offset: int, size: int = CHUNK_BYTES) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def discard(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.remove(folder.rstrip(os.sep) + ".tar.gz")
    except OSError:
        pass


# on the driver side --------------------------------------------------------------------------
def receive(read: Callable[[int], bytes], size: int, dest: str, deadline: float) -> None:
    """Fetch ``size`` bytes of a tar.gz with ``read(offset)`` and unpack it into ``dest``.

    ``TimeoutError`` when ``deadline`` (monotonic) passes first; the archive is unpacked only
    once it is whole, into a folder beside ``dest`` that is then merged into it (a second fit of
    one run adds its offline run next to the first), so ``dest`` never holds half a run.
    """
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    part = dest.rstrip(os.sep) + ".tar.gz.part"
    try:
        with open(part, "wb") as f:
            offset = 0
            while offset < size:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{offset} of {size} bytes received before the deadline")
                data = read(offset)
                if not data:
                    raise OSError(f"the node's archive ended at {offset} of {size} bytes")
                f.write(data)
                offset += len(data)
        unpacked = dest.rstrip(os.sep) + ".unpacking"
        shutil.rmtree(unpacked, ignore_errors=True)
        with tarfile.open(part, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpacked, filter="data")
            else:  # Python without extraction filters: refuse anything outside dest
                root = os.path.realpath(unpacked)
                for member in tar.getmembers():
                    target = os.path.realpath(os.path.join(unpacked, member.name))
                    if not (target == root or target.startswith(root + os.sep)) or member.issym() or member.islnk():
                        raise OSError(f"unsafe path in a node's archive: {member.name!r}")
                tar.extractall(unpacked)  # members checked above
        _merge(unpacked, dest)
    finally:
        shutil.rmtree(dest.rstrip(os.sep) + ".unpacking", ignore_errors=True)
        try:
            os.remove(part)
        except OSError:
            pass


def _merge(src: str, dst: str) -> None:
    """Move everything in ``src`` into ``dst``, folder by folder (renames, no copies)."""
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(s) and os.path.isdir(d):
            _merge(s, d)
        else:
            os.replace(s, d)


# through the run's storage -------------------------------------------------------------------
@dataclass(frozen=True)
class StorageSpot:
    """A folder of the run's storage (``RunConfig(storage_path=..., storage_filesystem=...)``)
    where node writers put their packed offline runs for the driver side to fetch:
    ``<experiment>/ray_wandb_nodes`` from :func:`storage_spot`, one run's folder below it from
    :meth:`for_run`.

    ``filesystem`` is a ``pyarrow.fs.FileSystem`` (Ray's own storage layer); it travels to the
    node loggers pickled, as Ray's ``StorageContext`` does to train workers.
    """

    filesystem: Any
    path: str

    @property
    def uri(self) -> str:
        return f"{self.filesystem.type_name}://{self.path}"

    def for_run(self, run_id: str) -> StorageSpot:
        return replace(self, path=f"{self.path}/{run_id}")

    def file(self, label: str) -> str:
        return f"{self.path}/{label}.tar.gz"


def _is_local(fs: Any) -> bool:
    import pyarrow.fs

    while isinstance(fs, pyarrow.fs.SubTreeFileSystem):
        fs = fs.base_fs
    return isinstance(fs, pyarrow.fs.LocalFileSystem)


def storage_spot(transfer: str, experiment_path: Any, storage_filesystem: Any) -> tuple[StorageSpot | None, str | None]:
    """The ``ray_wandb_nodes`` folder of an experiment's storage: (spot, None), or (None, why not).

    ``experiment_path`` and ``storage_filesystem`` as Ray's ``StorageContext`` has them
    (``experiment_fs_path``, a path in that filesystem), or a path or URI without a filesystem.
    ``transfer="ray"``: never (None, None). ``"auto"``: the storage unless it is this machine's
    local file system (a cloud URI or a custom filesystem is what every node reaches; a local
    path may be each node's own disk), else Ray. ``"storage"``: the storage, also a local path
    (an NFS mount is shared but looks local).
    """
    if transfer == "ray":
        return None, None
    if experiment_path is None:
        return None, "the run has no storage path" if transfer == "storage" else None
    try:
        import pyarrow.fs

        if storage_filesystem is not None:
            fs, path = storage_filesystem, str(experiment_path)
        else:
            fs, path = pyarrow.fs.FileSystem.from_uri(str(experiment_path))
    except Exception as e:  # noqa: BLE001 - e.g. an unknown scheme, a relative path
        return None, f"the storage path {str(experiment_path)!r} could not be opened ({type(e).__name__}: {e})"
    if transfer == "auto" and _is_local(fs):
        return None, None
    base = path.rstrip("/")
    return StorageSpot(fs, f"{base}/ray_wandb_nodes" if base or path.startswith("/") else "ray_wandb_nodes"), None


def put(archive: str, spot: StorageSpot, label: str, until: float) -> str:
    """On the node: copy ``archive`` into ``spot`` before ``until`` (wall-clock seconds, so that
    it holds on another machine); returns the file's path there.

    ``TimeoutError`` when ``until`` passes first; a partial copy is deleted, so a copy that
    would come too late to be fetched never stays in the storage.
    """
    if time.time() >= until:
        raise TimeoutError(f"no time left to copy to {spot.uri}")
    fs = spot.filesystem
    dest = spot.file(label)
    fs.create_dir(spot.path, recursive=True)
    copied = 0
    try:
        with (
            open(archive, "rb") as src,
            fs.open_output_stream(dest, compression=None) as out,
        ):  # not gzipped again for its name
            while chunk := src.read(CHUNK_BYTES):
                if time.time() >= until:
                    raise TimeoutError(f"{copied} bytes copied to {spot.uri} before the deadline")
                out.write(chunk)
                copied += len(chunk)
    except BaseException:
        remove(spot, label)
        raise
    return dest


def fetch(spot: StorageSpot, label: str, size: int, dest: str, deadline: float) -> None:
    """On the driver side: unpack the node's archive from ``spot`` into ``dest`` (as :func:`receive`).

    An ``OSError`` when the file is missing or of another size than the node packed: the
    storage is not the same for the node and the driver side (a local path on each machine).
    """
    path = spot.file(label)
    with spot.filesystem.open_input_file(path) as f:
        found = f.size()
        if found != size:
            raise OSError(f"{spot.uri}/{label}.tar.gz holds {found} bytes, the node packed {size}")
        receive(lambda offset: f.read_at(min(CHUNK_BYTES, size - offset), offset), size, dest, deadline)


def remove(spot: StorageSpot, label: str) -> None:
    """Delete the node's archive from ``spot`` (it may not be there; never raises)."""
    try:
        spot.filesystem.delete_file(spot.file(label))
    except Exception:  # noqa: BLE001 - not there, or a filesystem's own error (credentials, ...)
        pass


def remove_folder_if_empty(spot: StorageSpot) -> None:
    """Once every node's archive of the run is fetched: the run's storage folder if empty, and
    the ``ray_wandb_nodes`` folder above it if that is then empty and on a local path (removed
    only when empty at that instant, so a run collecting beside it is never touched; an
    object store may keep an empty folder marker). Never raises."""
    import pyarrow.fs

    fs = spot.filesystem
    try:
        if fs.get_file_info(pyarrow.fs.FileSelector(spot.path)):
            return
        fs.delete_dir(spot.path)
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            os.rmdir(spot.path.rsplit("/", 1)[0])
    except Exception:  # noqa: BLE001 - not there, not empty, or not ours to remove
        return
