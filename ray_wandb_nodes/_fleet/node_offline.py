"""A node logger's offline runs, brought to the driver side at the run's end: packed, copied into
the run's storage or read out in chunks through Ray, then removed. These are writer calls of
``NodeLogger`` (Ray's default group: one at a time, in order), which it takes from here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..offline import index as _index
from ..offline import storage as _storage
from ..offline import transfer as _transfer


@dataclass(frozen=True)
class PackedRun:
    """A node writer's offline run, packed on its node for the driver side: ``pack_offline``'s
    answer, which the offline collection (``collect.py``) reads to bring it over."""

    # The archive's path on the node (to copy into the run's storage, or read out in chunks);
    # None: nothing to bring (the writer left no data, or the archive was above the bound given:
    # the folder itself stays on the node).
    archive: str | None
    size: int  # the archive's bytes (0: the writer left no offline data)


class OfflineRuns:
    """The offline-run calls of ``NodeLogger``; it says which writers it hosts and finishes them."""

    def hosts(self, key: str) -> bool:
        raise NotImplementedError

    def finish(self, run_id: str | None = None, exit_code: int | None = None) -> Any:
        raise NotImplementedError

    def pack_offline(self, run_id: str, label: str, max_bytes: int | None = None) -> PackedRun:
        """Finish ``run_id``'s writer if it still runs, then pack its offline folder.

        The folder is found by path, not by memory, so the runs of a logger that restarted
        are packed too. Returns the archive's path and size (0 when there is nothing; no archive
        above ``max_bytes``).
        """
        if self.hosts(run_id):
            self.finish(run_id)
        folder = _index.node_local_dir(run_id, label)
        if not os.path.isdir(folder) or not os.listdir(folder):
            return PackedRun(archive=None, size=0)
        archive, size = _transfer.pack(folder)  # replaces the archive of an earlier try
        if max_bytes is not None and size > max_bytes:
            os.remove(archive)  # too big to bring over: the folder itself stays
            return PackedRun(archive=None, size=size)
        return PackedRun(archive=archive, size=size)

    def put_offline(self, archive: str, storage: _storage.StorageSpot, label: str, seconds: float) -> str:
        """Copy a packed offline run into the run's storage within ``seconds`` (a duration, timed here)."""
        return _storage.put(archive, storage, label, seconds)

    def remove_stored(self, storage: _storage.StorageSpot, label: str) -> None:
        """Delete a copy :meth:`put_offline` made (the driver side could not read it)."""
        _storage.remove(storage, label)

    def drop_archive(self, archive: str) -> None:
        """Delete a packed archive that will not be fetched (its folder stays)."""
        try:
            os.remove(archive)
        except OSError:
            pass

    def read_offline(self, archive: str, offset: int) -> bytes:
        return _transfer.read_chunk(archive, offset)

    def discard_offline(self, run_id: str, label: str) -> None:
        """Remove the node's copy once the driver side holds it."""
        _transfer.discard(_index.node_local_dir(run_id, label))
