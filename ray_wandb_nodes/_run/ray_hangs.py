"""Ray's own NCCL hang detector (Ray 2.60, ``RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR=1`` on the driver)
into the run. It runs on the Train controller, beside the run's primary writer, and only logs:
a possible hang after a minute, a confirmed one after ten (``ncclras`` shows a communicator whose
ranks' collective counts differ and none advances), with the ``ncclras`` history and every
rank's stacks uploaded under the experiment's ``hang_detector/`` folder. Here its log records
become the run's alerts (a WARN when suspected, an ERROR when confirmed, an INFO when the
communicator moves again) and a confirmed hang's files become the run's files under
``hangs/ray-nccl-<n>/``, so the NCCL view sits beside the plugin's own hang alerts.

Its messages are Ray's log text (``ray/train/v2/_internal/callbacks/nccl_ras.py``, 2.60): a
record that matches none of them is left to Ray's log. Nothing here can stop training: every
failure is one warning."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

from .. import _ray
from .._hang import HangNotice
from .._health import Alert, EventKind
from .._warn import Warner, describe

TITLE = "Ray NCCL hang detector"
SUSPECTED = "Possible NCCL hang detected!"
CONFIRMED = "have a collective mismatch and made no progress"
RESUMED = "resumed making progress"
DISABLED = "Disabling NCCL RAS hang detection"
MAX_FILE_BYTES = 1 << 20  # a rank's stacks or one ncclras poll; past it, the head is kept
_PATH = re.compile(r"\(([^()\s]+)\)\s*$")  # "... the per-rank stack traces (<path>)" at a line's end


class RayHangRelay(logging.Handler):
    """Ray's NCCL detector's records, turned into the run's alerts and files.

    ``primary`` takes ``alert(Alert)`` and ``hang(HangNotice)`` (the run's primary writer);
    ``storage`` is the run's ``(experiment path, pyarrow filesystem)``, where the detector
    uploads its diagnostics; ``label`` the controller node's label."""

    def __init__(self, primary: Any, label: str, storage: tuple[Any, Any], warner: Warner) -> None:
        super().__init__(level=logging.INFO)
        self._primary, self._label, self._warner = primary, label, warner
        self._experiment, self._fs = storage
        self._confirmed = 0
        self._threads: list[threading.Thread] = []
        self._saved: set[str] = set()  # the diagnostics' paths in storage already in the run

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._relay(record.getMessage())
        except Exception as e:  # noqa: BLE001 - a record that cannot be relayed stays in Ray's log
            self._warner.warn("ray-nccl-relay", f"a record of Ray's NCCL hang detector was not relayed ({describe(e)})")

    def _relay(self, message: str) -> None:
        if message.startswith(SUSPECTED):
            self._alert("possible hang", message, "WARN")
        elif CONFIRMED in message:
            self._confirmed += 1
            args = (self._confirmed, message)
            copy = threading.Thread(target=self._save, args=args, daemon=True, name="rwn-ray-nccl")
            self._threads.append(copy)
            copy.start()  # the files are read from storage off the controller's loop
        elif RESUMED in message:
            self._alert("progress again", message, "INFO", recovered=True)
        elif DISABLED in message:
            self._warner.warn("ray-nccl-disabled", f"Ray's NCCL hang detector is off for this run: {message}")

    def _alert(self, what: str, text: str, level: str, recovered: bool = False) -> None:
        self._primary.alert(Alert(f"{TITLE}: {what}", text, level, self._label, EventKind.HANG, recovered=recovered))

    def _save(self, episode: int, message: str) -> None:
        files: list[tuple[str, str]] = []
        try:
            for path in _paths(message):
                files += self._read_folder(path)
        except Exception as e:  # noqa: BLE001
            self._warner.warn("ray-nccl-files", f"Ray's NCCL hang diagnostics could not be read ({describe(e)})")
        self._hang(episode, f"{message.rstrip()}\nSaved into this run's files under hangs/{_folder(episode)}/.", files)

    def _hang(self, episode: int, text: str, files: list[tuple[str, str]]) -> None:
        """A confirmed hang to the primary: its ERROR alert and its files under ``hangs/ray-nccl-<n>/``."""
        notice = HangNotice(episode, f"{TITLE}: hang", text, "ERROR", files=tuple(files), name=_folder(episode))
        self._primary.hang(notice)

    def _read_folder(self, path: str) -> list[tuple[str, str]]:
        """Every file under ``path`` (a tool's folder in the run's storage), named ``<tool>/<file>``."""
        if self._fs is None:
            return []
        from pyarrow import fs as pafs

        tool = os.path.basename(path.rstrip("/"))
        out = []
        for info in self._fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File:
                continue
            with self._fs.open_input_stream(info.path) as f:
                data = f.read(MAX_FILE_BYTES)
            self._saved.add(info.path)
            out.append((f"{tool}/{os.path.relpath(info.path, path)}", data.decode(errors="replace")))
        return sorted(out)

    def _sweep(self) -> None:
        """Diagnostics no message named (``RAY_TRAIN_NCCL_RAS_ACTION=fail`` raises instead of
        logging the confirmed hang): the detector's folder, read at the run's end."""
        from pyarrow import fs as pafs

        root = os.path.join(str(self._experiment), _ray.NCCL_DETECTOR_DIR)
        found = self._fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        new = [i.path for i in found if i.type == pafs.FileType.File and i.path not in self._saved]
        if not new:
            return
        files = []
        for tool in sorted({os.path.relpath(p, root).split(os.sep)[0] for p in new}):
            files += self._read_folder(os.path.join(root, tool))
        self._confirmed += 1
        text = (
            "Ray's NCCL hang detector confirmed a hang and failed the attempt (RAY_TRAIN_NCCL_RAS_ACTION=fail): "
            f"a communicator's ranks' collective counts differ and none advances. Its diagnostics (every rank's "
            f"stacks, the ncclras polls) are in this run's files under hangs/{_folder(self._confirmed)}/."
        )
        self._hang(self._confirmed, text, files)

    def finish(self, timeout: float) -> None:
        """Wait (at most ``timeout`` in all) for the confirmed hangs' files to reach the primary."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        try:
            if self._fs is not None and self._experiment:
                self._sweep()
        except Exception as e:  # noqa: BLE001
            self._warner.warn("ray-nccl-files", f"Ray's NCCL hang diagnostics could not be read ({describe(e)})")
        self.close()


def _folder(episode: int) -> str:
    return f"ray-nccl-{episode}"


def _paths(message: str) -> list[str]:
    """The diagnostics folders a confirmed hang's message names, one a line."""
    return [m.group(1) for line in message.splitlines() if (m := _PATH.search(line))]


def relay_ray_hangs(primary: Any, label: str, storage: tuple[Any, Any], warner: Warner) -> RayHangRelay:
    """Relay Ray's NCCL detector into the run (on a Ray without one its logger stays silent);
    :func:`stop_relay` ends it."""
    relay = RayHangRelay(primary, label, storage, warner)
    logging.getLogger(_ray.NCCL_DETECTOR_LOGGER).addHandler(relay)
    return relay


def stop_relay(relay: RayHangRelay | None, timeout: float) -> None:
    if relay is not None:
        logging.getLogger(_ray.NCCL_DETECTOR_LOGGER).removeHandler(relay)
        relay.finish(timeout)
