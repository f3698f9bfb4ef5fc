"""The run's primary writer: one background thread that owns the ``wandb`` run.

Hooks only put work on a queue (a dict copy, no I/O), so the Train controller's event
loop never waits on W&B. The thread creates the run, logs rank 0's reports against the
step metric, and finishes the run with the training's exit code.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ._metrics import to_row
from ._wandb_io import init_writer
from ._warn import Warner, describe
from ._writers import WriterSpec

_LOG, _CONFIG, _FINISH = "log", "config", "finish"


class PrimaryWriter:
    def __init__(self, spec: WriterSpec, *, excludes: Sequence[str], warner: Warner) -> None:
        self.spec = spec
        self._excludes = tuple(excludes)
        self._warner = warner
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-primary", daemon=True)
        self._ready = threading.Event()
        self._done = threading.Event()
        self.run: Any = None
        self.error: BaseException | None = None
        self.entity: str | None = None
        self.project: str | None = None
        self.logged = 0
        self.dropped = 0
        self._step = 0

    # called from hooks: never blocks on W&B --------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def log(self, metrics: Mapping[str, Any]) -> None:
        self._queue.put((_LOG, dict(metrics)))

    def update_config(self, config: Mapping[str, Any]) -> None:
        self._queue.put((_CONFIG, dict(config)))

    def wait_ready(self, timeout: float) -> bool:
        """True once the run exists; False on timeout or when it could not be created."""
        return self._ready.wait(timeout) and self.run is not None

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.run is not None

    @property
    def failed(self) -> bool:
        return self._ready.is_set() and self.run is None

    def finish(self, exit_code: int, timeout: float) -> bool:
        """Flush and finish the run with ``exit_code``; False when not done within ``timeout``."""
        self._queue.put((_FINISH, exit_code))
        if not self._thread.is_alive() and not self._thread.ident:
            return True  # never started
        self._done.wait(timeout)
        if not self._done.is_set():
            pending = self._queue.qsize()
            self._warner.warn(
                "primary:finish-timeout",
                f"the W&B run {self.spec.run_id} did not finish within {timeout:.0f}s "
                f"({pending} queued item(s) not written); training results are unaffected",
            )
        return self._done.is_set()

    # the writer thread -----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._init()
            while True:
                kind, payload = self._queue.get()
                if kind == _FINISH:
                    self._finish(payload)
                    return
                if self.run is None:
                    self.dropped += kind == _LOG
                    continue
                if kind == _LOG:
                    self._log(payload)
                elif kind == _CONFIG:
                    self._config(payload)
        finally:
            self._ready.set()
            self._done.set()

    def _init(self) -> None:
        started = time.monotonic()
        try:
            self.run = init_writer(self.spec)
        except Exception as e:  # noqa: BLE001
            self.error = e
            self._warner.warn(
                "primary:init",
                f"could not create the W&B run {self.spec.run_id} after {time.monotonic() - started:.0f}s, "
                f"so nothing is logged to W&B for this run; training goes on ({describe(e)})",
            )
            return
        finally:
            self._ready.set()
        self.entity, self.project = self.run.entity, self.run.project
        try:
            # A resumed run (restart, auto-resume by name) continues its step count.
            last = self.run.summary.get(self.spec.step_metric)
            self._step = int(last) if isinstance(last, (int, float)) else 0
        except Exception:  # noqa: BLE001 - a fresh run has no summary to read
            self._step = 0

    def _log(self, metrics: dict[str, Any]) -> None:
        row, skipped = to_row(metrics, self._excludes)
        for key in skipped:
            self._warner.warn(
                f"skip:{key}",
                f"metric {key!r} ({type(_get(metrics, key)).__name__}) is not a number or string; not logged",
            )
        user_step = row.get(self.spec.step_metric)
        if isinstance(user_step, (int, float)) and not isinstance(user_step, bool):
            self._step = int(user_step)
        else:
            self._step += 1
            row[self.spec.step_metric] = self._step
        try:
            self.run.log(row)
            self.logged += 1
        except Exception as e:  # noqa: BLE001
            self.dropped += 1
            self._warner.warn(f"log:{type(e).__name__}", f"a report could not be logged to W&B ({describe(e)})")

    def _config(self, config: dict[str, Any]) -> None:
        try:
            self.run.config.update(config, allow_val_change=True)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"config:{type(e).__name__}", f"run config could not be updated ({describe(e)})")

    def _finish(self, exit_code: int) -> None:
        if self.run is None:
            if self.dropped:
                self._warner.warn(
                    "primary:dropped",
                    f"{self.dropped} report(s) were not logged because the W&B run "
                    f"{self.spec.run_id} could not be created",
                )
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as e:  # noqa: BLE001
            self._warner.warn("primary:finish", f"finishing the W&B run {self.spec.run_id} failed ({describe(e)})")


def _get(metrics: Mapping[str, Any], flat_key: str) -> Any:
    value: Any = metrics
    for part in flat_key.split("/"):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            return metrics.get(flat_key)
    return value
