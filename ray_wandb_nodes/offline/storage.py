"""The route through the run's storage: nodes put their packed runs there, the driver side fetches them."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from .transfer import CHUNK_BYTES, receive


class Transfer(Enum):
    """``offline_transfer``: how each node's offline run reaches the driver side (see :func:`storage_spot`)."""

    AUTO = "auto"  # the storage unless it is this machine's local file system, else Ray
    RAY = "ray"  # through Ray, in bounded chunks
    STORAGE = "storage"  # the run's storage, also a local path (an NFS mount is shared but looks local)


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


def storage_spot(
    transfer: Transfer, experiment_path: Any, storage_filesystem: Any
) -> tuple[StorageSpot | None, str | None]:
    """The ``ray_wandb_nodes`` folder of an experiment's storage: (spot, None), or (None, why not).

    ``experiment_path`` and ``storage_filesystem`` as Ray's ``StorageContext`` has them
    (``experiment_fs_path``, a path in that filesystem), or a path or URI without a filesystem.
    ``RAY``: never (None, None). ``AUTO``: the storage unless it is this machine's local file
    system (a cloud URI or a custom filesystem is what every node reaches; a local path may be
    each node's own disk), else Ray. ``STORAGE``: the storage, also a local path (an NFS mount is
    shared but looks local), and a reason when there is none.
    """
    if transfer is Transfer.RAY:
        return None, None
    if experiment_path is None:
        return None, "the run has no storage path" if transfer is Transfer.STORAGE else None
    try:
        import pyarrow.fs

        if storage_filesystem is not None:
            fs, path = storage_filesystem, str(experiment_path)
        else:
            fs, path = pyarrow.fs.FileSystem.from_uri(str(experiment_path))
    except Exception as e:  # noqa: BLE001 - e.g. an unknown scheme, a relative path
        return None, f"the storage path {str(experiment_path)!r} could not be opened ({type(e).__name__}: {e})"
    if transfer is Transfer.AUTO and _is_local(fs):
        return None, None
    base = path.rstrip("/")
    return StorageSpot(fs, f"{base}/ray_wandb_nodes" if base or path.startswith("/") else "ray_wandb_nodes"), None


def put(archive: str, spot: StorageSpot, label: str, seconds: float) -> str:
    """On the node: copy ``archive`` into ``spot`` within ``seconds`` from now, timed on this
    machine's monotonic clock (a duration, never another machine's timestamp: the node's wall
    clock may differ from the driver side's by seconds); returns the file's path there.

    ``TimeoutError`` when the time runs out first; a partial copy is deleted, so a copy that
    would come too late to be fetched never stays in the storage.
    """
    until = time.monotonic() + seconds
    if seconds <= 0:
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
                if time.monotonic() >= until:
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
