"""The one way out of the node for the ranks' console lines: each rank's text masked (``mask``),
then handed to the sink; a failing sink loses the lines with one warning, never the logger."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._mask import mask
from .._warn import Warner, describe
from .lines import ConsoleLine, Kind

Sink = Callable[[Sequence[ConsoleLine]], None]


def masked(line: ConsoleLine) -> ConsoleLine:
    """``line`` with its secrets masked (the plugin's own notes hold none)."""
    if line.kind is Kind.NOTE:
        return line
    text = mask(line.text)
    return line if text is line.text else line._replace(text=text)


class MaskedSink:
    """Hands lines to ``sink``, masked first: every line that leaves the node, live or last, goes
    through :meth:`send`."""

    def __init__(self, sink: Sink, warner: Warner) -> None:
        self._sink = sink
        self._warner = warner
        self.sent = 0  # lines handed to the sink

    def send(self, lines: list[ConsoleLine]) -> None:
        if not lines:
            return
        lines = [masked(line) for line in lines]
        try:
            self._sink(lines)
            self.sent += len(lines)
        except Exception as e:  # noqa: BLE001 - a failing sink loses lines, never the logger
            self._warner.warn(f"console:sink:{type(e).__name__}", f"ranks' console lines were not sent ({describe(e)})")
