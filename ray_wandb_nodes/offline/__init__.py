"""Offline runs: one folder per W&B run on the driver side, with every node's data in it.

Shared mode cannot be offline, so in offline mode every writer writes an offline run of its
own under the run's id, labelled as in shared mode. The primary writes straight into the
run's folder; a node writer writes into its node's temp folder and, at the end, its data is
packed (tar.gz), brought to the driver side (through Ray in bounded chunks, or through the
run's storage: see :func:`storage.storage_spot`) and unpacked next to the primary's::

    <dir>/ray_wandb_nodes/<run id>/
        index.json                                   the run, its writers, labels and paths
        primary/wandb/offline-run-<time>-<id>/       the primary's offline run
        nodes/<label>/wandb/offline-run-<time>-<id>/ one per node writer

This package is the runtime side, which every node writer imports: ``index`` (the folder
and its ``index.json``), ``transfer`` (pack on the node, receive and merge on the driver
side), ``storage`` (the route through the run's storage). It imports neither wandb nor
matplotlib. Reading such a folder (``ray-wandb-nodes report`` and ``ray-wandb-nodes sync``)
is :mod:`ray_wandb_nodes.report`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["index", "storage", "transfer"]

# Where the report tooling's names went when it left this package: the runtime side must not
# import it (report/ imports offline/), so an old import is told the new place instead.
_MOVED = {
    **{name: "ray_wandb_nodes.report" for name in ("load", "format_text", "to_json", "write_png", "read_run")},
    "report": "ray_wandb_nodes.report.summary",
    **{name: f"ray_wandb_nodes.report.{name}" for name in ("render", "sync", "walk", "gpu_flags")},
    "txlog": "ray_wandb_nodes._wandb.txlog",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        raise AttributeError(f"ray_wandb_nodes.offline.{name} has moved: import it from {_MOVED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
