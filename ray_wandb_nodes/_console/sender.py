"""``RunConsole``: the ranks' lines into a run's Logs tab, from a writer that is not the rank.

wandb has one public way to put text that is not the writing process's own console into a run:
``Run.write_logs(text)`` (wandb 0.27+, the same call its ``capture_loggers`` setting makes). It
works whatever the writer's ``console`` setting: the node writers keep ``console="off"``, so
their own process's output stays out, and wandb-core still sends these lines on the run's
file_stream as ``output.log`` lines. Each line is labelled with the writer's ``x_label`` (the
node): ``<ts> [node-1] [rank 3] text`` in the legacy format, ``{"label": "node-1", "content":
"[rank 3] text", ...}`` where the server takes structured console logs. The rank is part of the
text: wandb gives one label a writer, and one writer a rank would cost a W&B connection a rank.

``write_logs`` has no error level: a rank's stderr lines come in as plain lines (Ray Train sends a
rank's ``print`` to stderr anyway, so stderr does not mean error there).

wandb 0.28.0 and 0.28.1 keep the newline ``write_logs`` adds inside the line (a blank line after
each, and several lines in one call as one line; wandb PR #12387, fixed in 0.28.2). There each
line goes alone, without the newline, through the writer's interface as ``write_logs`` does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

from .lines import ConsoleLine, Kind

BATCH_LINES, BATCH_CHARS = 500, 256 << 10  # one write_logs call: one record to wandb-core


def rank_prefix(rank: int) -> str:
    return f"[rank {rank}]"


def format_line(line: ConsoleLine, prefix: Callable[[int], str] = rank_prefix) -> str:
    """The text of ``line`` in the run: its rank, then the rank's text or the plugin's note."""
    if line.kind is Kind.NOTE:
        return f"{prefix(line.rank)} ray_wandb_nodes: {line.text}"
    return f"{prefix(line.rank)} {line.text}"


def _splits_lines(version: str) -> bool:
    """Whether this wandb's ``write_logs`` takes several lines in one call (0.28.2 and later)."""
    parts: list[int] = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= (0, 28, 2)


class RunConsole:
    """A sink for ``ConsoleTailer``: writes the lines into ``run`` (a ``wandb.Run``).

    ``lock``: held around each write where another thread of the process also uses the run.
    """

    def __init__(
        self,
        run: Any,
        lock: threading.Lock | None = None,
        prefix: Callable[[int], str] = rank_prefix,
        wandb_version: str | None = None,
    ) -> None:
        if wandb_version is None:
            import wandb

            wandb_version = str(wandb.__version__)
        self._run = run
        self._lock = lock
        self._prefix = prefix
        self._batched = _splits_lines(wandb_version)

    def __call__(self, lines: Sequence[ConsoleLine]) -> None:
        texts = [format_line(line, self._prefix) for line in lines]
        with self._lock or nullcontext():
            if self._batched:
                for batch in _batches(texts):
                    self._run.write_logs("\n".join(batch))
            else:
                self._one_by_one(texts)

    def _one_by_one(self, texts: list[str]) -> None:
        interface = getattr(self._run, "_interface", None)
        publish = getattr(interface, "publish_output_logger", None)
        if publish is None or getattr(self._run, "_is_finished", False):
            for text in texts:
                self._run.write_logs(text)
            return
        for text in texts:
            publish(text, nowait=True)


def _batches(texts: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    batch: list[str] = []
    chars = 0
    for text in texts:
        if batch and (len(batch) >= BATCH_LINES or chars + len(text) > BATCH_CHARS):
            out.append(batch)
            batch, chars = [], 0
        batch.append(text)
        chars += len(text) + 1
    if batch:
        out.append(batch)
    return out
