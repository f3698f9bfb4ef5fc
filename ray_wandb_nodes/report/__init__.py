"""The command line's report and sync of offline runs (``ray-wandb-nodes report`` and ``sync``).

An offline run folder (see :mod:`ray_wandb_nodes.offline`) holds every node's run; this
package reads it. ``walk`` (finding runs and the writer of each file in a folder),
``summary`` (``load``: per-node summaries and flags), ``gpu_flags`` (the live run's GPU
rules replayed over the samples), ``render`` (their text, JSON and PNG forms), ``sync``
(upload into one W&B run). ``load``, ``format_text``, ``to_json``, ``write_png`` and
``read_run`` (wandb's transaction-log reader) are here too, imported on first use, so that
importing this package imports neither wandb nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._wandb_log import read_run
    from .render import format_text, to_json, write_png
    from .summary import load

__all__ = ["format_text", "load", "read_run", "to_json", "write_png"]
_HOME = {
    "load": ".summary",
    "format_text": ".render",
    "to_json": ".render",
    "write_png": ".render",
    "read_run": ".._wandb_log",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name], __name__), name)
