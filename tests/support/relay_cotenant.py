"""A co-tenant of the relay, and the relay's process as the machine sees it (``tests/e2e/test_hosts.py``).

**The co-tenant** runs inside a host of the cluster (a node's address: the relay closes any other
peer without a word, so a flood from elsewhere would test nothing past that), without the run's
token::

    python -m tests.support.relay_cotenant HOST PORT

A round: ``REQUESTS`` requests, ``CONCURRENT`` at a time, each for a host of its own (one in
``NAMED`` a valid name of random labels, the rest a single 8 KiB label: with the ``Host`` line's
copy, a head the relay reads 16 KiB of, its bound, then refuses), then ``SILENT`` sockets opened
that never send a byte, held until the relay closes each (it evicts them, or their head times
out). It prints one JSON line a round (``{"held": n, "closed_by_relay": n, "answers": {status
line: count}, ...}``), then reads a line from stdin: one more round, or at its end, exits. Every
host it asks for starts with ``MARK``, so a log line that carried one is found.

**The relay's process** (:func:`relay_process`): the relay actor's pid on the machine (the head
has a PID namespace of its own: Ray's pid is the one inside it), its listening port (the process's
one listener on the head's address that is not its Ray worker's gRPC port), its memory and its log.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import string
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REQUESTS, CONCURRENT, SILENT = 4000, 32, 6000
NAMED = 4  # one request in NAMED asks for a valid name: its refusal's log line shows the host
MARK = "cotenant"
HOST_BYTES = 8192
LONG_HEADS = REQUESTS - REQUESTS // NAMED  # heads of 16 KiB and more, a round


def random_host(i: int) -> str:
    """A host of its own for request ``i``: a valid name (labels of up to 63 characters, 250 in
    all) or one label of ``HOST_BYTES``."""
    letters = string.ascii_lowercase + string.digits
    if i % NAMED:
        return MARK + "".join(random.choices(letters, k=HOST_BYTES - len(MARK)))
    labels = [MARK + str(i)]
    while sum(len(x) + 1 for x in labels) < 190:
        labels.append("".join(random.choices(letters, k=random.randint(1, 63))))
    return ".".join(labels) + ".example"


async def ask(host: str, port: int, target: str, answers: Counter[str]) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        answers[f"connect failed: {type(e).__name__}"] += 1
        return
    try:
        writer.write(f"CONNECT {target}:443 HTTP/1.1\r\nHost: {target}:443\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), 30)
        answers[line.decode(errors="replace").strip()[:40] or "closed"] += 1
    except (OSError, asyncio.TimeoutError) as e:
        answers[type(e).__name__] += 1
    finally:
        writer.close()


async def let_go(reader: asyncio.StreamReader) -> bool:
    """Whether the relay let go of this silent socket: closed it (evicted) or answered its head's
    timeout (within its ``head_timeout_s``, 5 s, and a margin for a loaded machine)."""
    try:
        await asyncio.wait_for(reader.read(1), 60)
        return True
    except OSError:  # reset: closed all the same
        return True
    except asyncio.TimeoutError:
        return False


async def one_round(host: str, port: int) -> dict[str, object]:
    answers: Counter[str] = Counter()
    queue = iter(range(REQUESTS))

    async def worker() -> None:
        for i in queue:
            await ask(host, port, random_host(i), answers)

    await asyncio.gather(*(worker() for _ in range(CONCURRENT)))
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed: Counter[str] = Counter()
    for _ in range(SILENT):
        try:
            held.append(await asyncio.open_connection(host, port))
        except OSError as e:
            failed[type(e).__name__] += 1
    closed = sum(await asyncio.gather(*(let_go(r) for r, _ in held)))
    for _, writer in held:
        writer.close()
    return {"held": len(held), "closed_by_relay": closed, "answers": answers, "failed": failed}


async def flood(host: str, port: int) -> None:
    """Rounds until stdin ends: each line on it asks for one more."""
    loop = asyncio.get_running_loop()
    while True:
        print(json.dumps(await one_round(host, port)), flush=True)
        if not await loop.run_in_executor(None, sys.stdin.readline):
            return


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = SILENT + CONCURRENT + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    asyncio.run(flood(sys.argv[1], int(sys.argv[2])))


# the relay's process, from the machine --------------------------------------------------------
@dataclass(frozen=True)
class RelayProcess:
    pid: int  # on the machine
    ray_pid: int  # inside the head's PID namespace (Ray's, and its log files')
    host: str
    port: int

    def status(self, field: str) -> int:
        """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``: the most it ever had)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def log(self, ray_folder: Path) -> str:
        """What the relay's worker process wrote to its stderr and stdout (Ray's worker files)."""
        paths = {p.resolve() for p in ray_folder.glob(f"session_*/logs/worker-*-{self.ray_pid}.*")}  # not twice:
        # session_latest is a link to the session's folder
        return "".join(p.read_text(errors="replace") for p in sorted(paths) if p.suffix in (".err", ".out"))


def relay_process(head_init: int, head_address: str) -> RelayProcess | None:
    """The run's relay actor's process (None: Ray has no live one yet)."""
    import ray._private.state as state

    live = [a for a in state.actors().values() if a["ActorClassName"] == "RelayActor" and a["State"] == "ALIVE"]
    if len(live) != 1 or not live[0]["Pid"]:
        return None
    actor = live[0]
    pid = machine_pid(head_init, int(actor["Pid"]))
    ports = listening_ports(pid, head_address) - {int(actor["Address"]["Port"])}
    if len(ports) != 1:
        return None  # not listening yet (or an unknown listener: the caller's wait names it)
    return RelayProcess(pid, int(actor["Pid"]), head_address, ports.pop())


def machine_pid(init: int, inner: int) -> int:
    """The machine's pid of the process ``inner`` of the PID namespace of ``init``."""
    space = os.readlink(f"/proc/{init}/ns/pid")
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != space:
                continue
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspid[-1]) == inner:
            return int(name)
    raise LookupError(f"no process {inner} in the PID namespace of {init}")


def listening_ports(pid: int, address: str) -> set[int]:
    """The TCP ports process ``pid`` listens on at ``address`` (IPv4)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    want = "".join(f"{int(x):02X}" for x in reversed(address.split(".")))
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        ip, port = local.split(":")
        if state == "0A" and ip == want and inode in inodes:  # 0A: LISTEN
            ports.add(int(port, 16))
    return ports


if __name__ == "__main__":
    main()
