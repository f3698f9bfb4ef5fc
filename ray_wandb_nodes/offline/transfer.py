"""A node's offline run from its node to the driver side: packed there, received and merged here."""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from collections.abc import Callable

CHUNK_BYTES = 4 << 20
MAX_COLLECT_BYTES = 2 << 30  # a node's packed offline run above this stays on its node


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
