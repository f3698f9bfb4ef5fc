"""What ``bench/relay_cost.py`` stands on: the relay in a process of its own (as in its actor),
and simulated node writers that send a real writer's traffic through it to a sink.

A simulated writer keeps ``connections`` tunnels open (CONNECT, the run's token) as wandb-core
keeps its connections alive, and sends on each, at a random phase, one request of ``up`` bytes
every ``period_s`` seconds, answered by ``down`` bytes: the sizes and the rate one real writer's
traffic had through the relay (TLS records included: the relay sees only bytes). The sink reads an
8-byte header (the request's and the answer's sizes), the request, and answers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from ray_wandb_nodes._config.secrets import Secret
from ray_wandb_nodes._egress import RelayConfig, RelayThread, allow_list
from ray_wandb_nodes._egress.actor import raise_descriptor_limit

HEADER = struct.Struct("!II")


@dataclass(frozen=True)
class Profile:
    """One writer's traffic: per connection, a request of ``up`` bytes every ``period_s``, answered
    by ``down`` bytes."""

    connections: int
    period_s: float
    up: int
    down: int


@dataclass
class RoundTrips:
    seconds: list[float] = field(default_factory=list)
    failed: int = 0


class RelayProcess:
    """``python -m bench._relay_load HOST TOKEN ALLOWED...`` as a child: it prints its port, then
    answers ``stats`` with its counters as JSON and ``stop`` with its last ones."""

    def __init__(self, host: str, token: Secret, allowed: list[str]) -> None:
        argv = [sys.executable, "-m", "bench._relay_load", host, *allowed]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(token.reveal() + "\n")
        self.proc.stdin.flush()
        self.host, self.port = host, int(self.proc.stdout.readline())
        self.pid = self.proc.pid

    def ask(self, what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def stop(self) -> dict[str, Any]:
        stats = self.ask("stop")
        self.proc.wait(30)
        return stats


def _child(host: str, allowed: list[str]) -> None:
    token = Secret(sys.stdin.readline().strip())
    raise_descriptor_limit(2 * 4096 + 256)
    # The simulated writers all come from this machine's one address, where 1,000 nodes' would
    # come from 1,000: the budget before the token is the relay's whole one, not one node's.
    relay = RelayThread(
        RelayConfig(allow_list(None, allowed), token, host, max_connections=4096, unauthenticated_per_peer=4096)
    )
    print(relay.start()[1], flush=True)
    for line in sys.stdin:
        stats = relay.stop() if line.strip() == "stop" else relay.stats()
        print(json.dumps(stats.__dict__), flush=True)
        if line.strip() == "stop":
            return


async def sink(host: str) -> tuple[asyncio.Server, int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                up, down = HEADER.unpack(await reader.readexactly(HEADER.size))
                await reader.readexactly(up - HEADER.size)
                writer.write(b"\0" * down)
                await writer.drain()
        except (asyncio.IncompleteReadError, OSError, asyncio.CancelledError):
            writer.close()  # the client left, or the sink closes

    server = await asyncio.start_server(serve, host, 0, backlog=4096)
    return server, int(server.sockets[0].getsockname()[1])


async def _open(
    relay: tuple[str, int] | None, target: tuple[str, int], token: Secret
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``target``: through the relay (a tunnel), or straight (``relay`` None)."""
    if relay is None:
        return await asyncio.open_connection(*target)
    reader, writer = await asyncio.open_connection(*relay)
    auth = base64.b64encode(f"relay:{token.reveal()}".encode()).decode()
    where = f"{target[0]}:{target[1]}"
    writer.write(f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
    answer = await reader.readuntil(b"\r\n\r\n")
    if not answer.startswith(b"HTTP/1.1 200"):
        raise OSError(f"the relay answered {answer[:40]!r}")
    return reader, writer


async def writer_connection(
    relay: tuple[str, int] | None,
    target: tuple[str, int],
    token: Secret,
    profile: Profile,
    until: float,
    measure_from: float,
    trips: RoundTrips,
) -> None:
    """One connection of a simulated writer: opened, then a request every ``period_s`` until ``until``."""
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await _open(relay, target, token)
    except OSError:
        trips.failed += 1
        return
    payload = HEADER.pack(profile.up, profile.down) + b"x" * (profile.up - HEADER.size)
    await asyncio.sleep(random.uniform(0, profile.period_s))
    try:
        while loop.time() < until:
            started = loop.time()
            writer.write(payload)
            await reader.readexactly(profile.down)
            if started >= measure_from:
                trips.seconds.append(loop.time() - started)
            await asyncio.sleep(max(0.0, profile.period_s - (loop.time() - started)))
    except (OSError, asyncio.IncompleteReadError):
        trips.failed += 1
    finally:
        writer.close()


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2:])
