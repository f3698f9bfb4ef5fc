"""Checkpoints as W&B artifacts: local folders are uploaded, remote ones become references.

Ray's own callback silently drops checkpoints that are not on the local filesystem
(ray issue #58991); here a checkpoint on S3, GCS or any other pyarrow filesystem is
logged as a reference artifact pointing at its URI, so it is never lost from the run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
IMMUTABLE = "immutable"  # wandb's add_dir policy that uploads files in place (no staging copy)


def artifact_name(name: str) -> str:
    """A name W&B accepts for an artifact (letters, digits, '-', '_', '.')."""
    return _NAME_UNSAFE.sub("-", name).strip("-.")[:128] or "checkpoint"


def checkpoint_uri(filesystem: Any, path: str) -> str | None:
    """The URI of a checkpoint on a non-local filesystem; None when it is local."""
    import pyarrow.fs as pafs

    if filesystem is None or isinstance(filesystem, pafs.LocalFileSystem):
        return None
    if isinstance(filesystem, pafs.S3FileSystem):
        return f"s3://{path.lstrip('/')}"
    if isinstance(filesystem, pafs.GcsFileSystem):
        return f"gs://{path.lstrip('/')}"
    if isinstance(filesystem, pafs.PyFileSystem):
        handler = getattr(filesystem, "handler", None)
        inner = getattr(handler, "fs", None)
        protocol = getattr(inner, "protocol", None)
        if isinstance(protocol, (list, tuple)):
            protocol = protocol[0]
        if protocol and protocol not in ("file", "local"):
            return f"{protocol}://{path.lstrip('/')}"
        if protocol in ("file", "local"):
            return None
    return f"{filesystem.type_name}://{path.lstrip('/')}"


@dataclass(frozen=True)
class CheckpointAt:
    """A checkpoint known only by its path, as Train-in-Tune results carry it (``checkpoint_path``)."""

    path: str
    filesystem: Any = None

    @classmethod
    def from_result(cls, path: str, fallback_filesystem: Any) -> CheckpointAt:
        """Local when the path exists here, else on ``fallback_filesystem`` (the trial's storage)."""
        import os

        import pyarrow.fs as pafs

        if os.path.exists(path):
            return cls(path, pafs.LocalFileSystem())
        return cls(path, fallback_filesystem)


class CheckpointGoneError(Exception):
    """A checkpoint's folder (or a file of it) vanished while its artifact was built or uploaded:
    Ray deletes old checkpoints once ``CheckpointConfig(num_to_keep=...)`` is reached."""


def checkpoint_artifact(wandb: Any, *, name: str, checkpoint: Any) -> Any:
    """A ``model`` artifact of a Ray checkpoint: its files, or a reference to its URI.

    The files are uploaded from where they are, never copied on this node: Ray has persisted
    the checkpoint and no longer changes it, so wandb's ``immutable`` policy (no staging copy)
    and ``skip_cache`` (no copy into wandb's artifact cache after the upload) hold; both are
    in every wandb from 0.28. Building it still reads every file once, for its digest.
    Raises :class:`CheckpointGoneError` when Ray deleted the folder before or while it was read.
    """
    path = str(checkpoint.path)
    uri = checkpoint_uri(getattr(checkpoint, "filesystem", None), path)
    artifact = wandb.Artifact(name=artifact_name(name), type="model", metadata={"ray_checkpoint_path": uri or path})
    if uri is None:
        try:
            artifact.add_dir(path, skip_cache=True, policy=IMMUTABLE)
        except (OSError, ValueError) as e:  # add_dir: ValueError when the folder is gone
            if os.path.isdir(path) and not isinstance(e, FileNotFoundError):
                raise
            raise CheckpointGoneError(f"its folder was deleted before its files were read ({type(e).__name__})") from e
        still_whole(artifact, path)
    else:
        add_reference(artifact, uri)
    return artifact


def still_whole(artifact: Any, path: str) -> None:
    """Raise :class:`CheckpointGoneError` unless the folder and every file the artifact lists are still
    there. Ray deletes a whole folder at once, so a listing taken while it deleted would leave
    files out; a version of a partial checkpoint must never be logged (``latest`` would move to it)."""
    missing = [e.path for e in artifact.manifest.entries.values() if e.local_path and not os.path.exists(e.local_path)]
    if missing or not os.path.isdir(path):
        what = f"{len(missing)} of its files" if missing else "its folder"
        raise CheckpointGoneError(f"{what} vanished while its artifact was built")


def add_reference(artifact: Any, uri: str) -> None:
    """Reference ``uri`` without reading it (no checksum).

    wandb's handlers for s3:// and gs:// need boto3 or google-cloud-storage even then; where
    those are missing the entry is recorded as it would be, rather than the checkpoint lost.
    """
    name = uri.rstrip("/").rsplit("/", 1)[-1] or "checkpoint"
    try:
        artifact.add_reference(uri, name=name, checksum=False)
    except Exception:  # noqa: BLE001 - a storage library is missing
        from wandb.sdk.artifacts.artifact_manifest_entry import ArtifactManifestEntry

        artifact.manifest.add_entry(ArtifactManifestEntry(path=name, ref=uri, digest=uri))


def checkpoint_aliases(score: Any, best: float | None, maximize: bool) -> tuple[list[str], float | None]:
    """The aliases of a new checkpoint and the best score after it: ``latest`` always, and
    ``best`` when its numeric ``score`` beats ``best`` (higher when ``maximize``)."""
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return ["latest"], best
    if best is None or (score > best if maximize else score < best):
        return ["latest", "best"], float(score)
    return ["latest"], best
