"""A TCP forwarder that keeps every byte it forwards: put between a client and the relay, it holds
exactly what the relay receives and sends, connection by connection."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass
class Tapped:
    """One connection: what the client sent, what it got back."""

    up: bytearray = field(default_factory=bytearray)
    down: bytearray = field(default_factory=bytearray)


class Wiretap:
    """Listens on ``host`` (any free port), forwards each connection to ``target``."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.host, self.target = host, target
        self.port = 0
        self.connections: list[Tapped] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wiretap", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> Wiretap:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Wiretap:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def taps(self) -> list[Tapped]:
        with self._lock:
            return [Tapped(bytearray(t.up), bytearray(t.down)) for t in self.connections]

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tapped = Tapped()
        with self._lock:
            self.connections.append(tapped)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, into: bytearray) -> None:
            try:
                while data := await src.read(65536):
                    with self._lock:
                        into += data
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, tapped.up), pump(up_reader, writer, tapped.down))
