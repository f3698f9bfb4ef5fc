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

The package: ``index`` (the folder and its ``index.json``), ``transfer`` (pack on the node,
receive and merge on the driver side), ``storage`` (the route through the run's storage),
``walk`` (finding runs and their writers in a folder), ``report`` (per-node summaries and
flags), ``render`` (their text, JSON and PNG forms), ``sync`` (upload into one W&B run);
wandb's transaction-log reader is ``ray_wandb_nodes._wandb_log``. ``load``, ``format_text``,
``to_json``, ``write_png`` and ``read_run`` are here too, imported on first use (importing this package
imports neither wandb nor matplotlib: the node writers import it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._wandb_log import read_run
    from .render import format_text, to_json, write_png
    from .report import load

__all__ = ["format_text", "load", "read_run", "to_json", "write_png"]
_HOME = {
    "load": ".report",
    "format_text": ".render",
    "to_json": ".render",
    "write_png": ".render",
    "read_run": ".._wandb_log",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name], __name__), name)
