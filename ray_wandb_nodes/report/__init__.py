"""The command line's report and sync of offline runs (``ray-wandb-nodes report`` and ``sync``).

An offline run folder (see :mod:`ray_wandb_nodes.offline`) holds every node's run; this
package reads it. ``walk`` (finding runs and the writer of each file in a folder),
``summary`` (``load``: per-node summaries and flags), ``gpu_flags`` (the live run's GPU
rules replayed over the samples), ``render`` (their text, JSON and PNG forms), ``sync``
(upload into one W&B run, what ``ray-wandb-nodes sync`` runs). ``load``, ``format_text``, ``to_json``, ``write_png`` and
``read_run`` (wandb's transaction-log reader) are here too, imported on first use, so that
importing this package imports neither wandb nor matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._wandb.txlog import read_run
    from .render import format_text, to_json, write_png
    from .summary import load

__all__ = ["format_text", "load", "read_run", "sync", "to_json", "write_png"]


def __getattr__(name: str) -> Any:
    # Statements, not import_module, so that tests/test_layout.py sees every import.
    if name == "load":
        from .summary import load

        return load
    if name in ("format_text", "to_json", "write_png"):
        from . import render

        return getattr(render, name)
    if name == "read_run":
        from .._wandb.txlog import read_run

        return read_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
