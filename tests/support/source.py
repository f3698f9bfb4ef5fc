"""Where a test's own scripts are: the line a ``# <marker>`` comment stands on, so that a test can
name the place a stack or a traceback shows without a line number written twice."""

from __future__ import annotations

from pathlib import Path


def line_of(script: Path, marker: str) -> int:
    """The number of the line of ``script`` that carries ``# <marker>``."""
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if f"# <{marker}>" in text:
            return number
    raise AssertionError(f"no line of {script.name} carries # <{marker}>")
