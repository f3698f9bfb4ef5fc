"""``NodeLogger``: the small Ray actor on each node that hosts that node's W&B writers.

A writer in shared mode joins the run as a non-primary: wandb-core then samples this
node's GPUs, CPU, memory, disk and network and labels every key with the node's label.
The actor takes no CPU (``num_cpus=0``) and sits in a placement-group bundle of a little
memory. It reports failures as data (``status()``) instead of dying, so one bad node is
one warning on the driver side, never a dead run.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from ._wandb_io import init_writer
from ._warn import describe
from ._writers import WriterSpec, node_dir


class NodeLogger:
    def __init__(self, specs: list[WriterSpec] | None = None) -> None:
        os.environ.pop("WANDB_SERVICE", None)
        self._runs: dict[str, Any] = {}
        self._errors: dict[str, str] = {}
        self._labels: dict[str, str] = {}
        for spec in specs or []:
            self.add_writer(spec)

    def add_writer(self, spec: WriterSpec) -> dict[str, Any]:
        """Join ``spec``'s run (idempotent per run id); returns :meth:`status`."""
        if spec.run_id in self._runs:
            return self.status()
        self._labels[spec.run_id] = spec.label
        try:
            path = node_dir(spec.init_kwargs.get("dir"), spec.run_id, spec.label)
            self._runs[spec.run_id] = init_writer(spec, dir=path)
            self._errors.pop(spec.run_id, None)
        except Exception as e:  # noqa: BLE001 - reported through status()
            self._errors[spec.run_id] = describe(e)
        return self.status()

    def status(self) -> dict[str, Any]:
        import ray

        return {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "runs": sorted(self._runs),
            "labels": dict(self._labels),
            "errors": dict(self._errors),
        }

    def finish(self, run_id: str | None = None) -> dict[str, Any]:
        """Finish one writer, or all when ``run_id`` is None; never sends the run's final state."""
        ids = [run_id] if run_id is not None else list(self._runs)
        for rid in ids:
            run = self._runs.pop(rid, None)
            if run is None:
                continue
            try:
                run.finish()
            except Exception as e:  # noqa: BLE001
                self._errors[rid] = f"finish failed: {describe(e)}"
        return self.status()
