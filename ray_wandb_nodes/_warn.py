"""One clear warning per distinct problem, never an exception into Ray."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("ray_wandb_nodes")

_F = TypeVar("_F", bound=Callable[..., Any])


class Warner:
    """Logs each distinct warning once (keyed by ``key``), so a flapping backend is one line."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warn(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        logger.warning("ray_wandb_nodes: %s", message)

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def guarded(hook: str) -> Callable[[_F], _F]:
    """Run a Ray hook so that no exception escapes: a raise in a Train hook fails the whole run."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - logging must never kill training
                warner: Warner = getattr(self, "_warner", None) or Warner()
                warner.warn(
                    f"hook:{hook}:{type(e).__name__}",
                    f"{hook} failed and was skipped; training goes on ({describe(e)})",
                )
                return None

        return inner  # type: ignore[return-value]

    return wrap


def warn_skipped(warner: Warner, skipped: list[str], limit: int = 20) -> None:
    """One warning per key left out of a row (the first ``limit`` distinct ones, then a count)."""
    for key in skipped[:limit]:
        warner.warn(f"skip:{key}", f"metric {key} is not logged: W&B cannot chart it")
    if len(skipped) > limit:
        warner.warn(
            "skip:many", f"{len(skipped)} metrics of one report were not logged; the first {limit} are named above"
        )
