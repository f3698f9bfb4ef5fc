"""A relay on an event loop of its own, in a daemon thread.

The loop's thread owns the relay and all of its state; other threads send it calls
(``run_coroutine_threadsafe``) and wait for their answers with a bound. Used by the relay's
actor, by the tests and by ``bench/relay_cost.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .relay import Relay, RelayConfig, RelayStats

T = TypeVar("T")


class RelayThread:
    """Start, ask and stop one relay from any thread."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self._relay = Relay(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None
        self.final: RelayStats | None = None

    def start(self, timeout_s: float = 10.0) -> tuple[str, int]:
        """Listen; the address and port. Raises OSError where the address cannot be bound."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ray_wandb_nodes-relay", daemon=True)
        self._thread.start()
        try:
            self.address = self._call(self._relay.start(), timeout_s)
        except BaseException:
            self._end(timeout_s)
            raise
        return self.address

    def stats(self, timeout_s: float = 5.0) -> RelayStats:
        if self.final is not None:
            return self.final

        async def read() -> RelayStats:
            return self._relay.stats()

        return self._call(read(), timeout_s)

    def stop(self, timeout_s: float = 10.0) -> RelayStats:
        """Close every connection and the listener, end the thread; what it served."""
        if self.final is None and self._loop is not None:
            try:
                self.final = self._call(self._relay.stop(), timeout_s)
            finally:
                self._end(timeout_s)
        return self.final if self.final is not None else self._relay.stats()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.final is None

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the relay is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _end(self, timeout_s: float) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()
