"""The one way the tests wait for something: poll a check until it holds, or fail naming what was
awaited and the last value the check returned."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout_s: float, what: str | Callable[[], str], *, every_s: float = 0.2) -> T:
    """Call ``check`` every ``every_s`` seconds until it returns a true value, and return that value.
    After ``timeout_s`` seconds, an ``AssertionError`` names ``what`` was awaited (a callable is asked
    then, so it can describe the state at the end) and the last value ``check`` returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s} s waiting for {described}; last seen: {value!r}")
        time.sleep(every_s)
