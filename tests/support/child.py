"""A Python child process of the tests: ``python -c CODE`` with this checkout importable, handed to
the test once it printed ``ready`` and killed by its pid when the block ends."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def python_child(code: str) -> Iterator[subprocess.Popen[str]]:
    """``code`` in a process of its own (its stdin a pipe the test may hold open), once it printed
    ``ready``; killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()
