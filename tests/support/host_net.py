"""The network of the test hosts (``tests/support/hosts.py``): a slot of names and addresses held
by a lock, a bridge on the machine, one network namespace per host joined to it by a veth pair,
the routes that block a host's way to an address, and the sweep of what a crashed run left.

Every name starts with ``rwnh<slot>``: the bridge ``rwnh<slot>``, each host's namespace and the
machine's end of its veth ``rwnh<slot>-<host>`` (the host's end is its ``eth0``). The slot's
network is ``198.18.<slot>.0/24`` (RFC 2544's benchmarking range), checked unused on the machine.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

from tests.support import host_memory

PREFIX = "rwnh"
SLOTS = 16
LOCKS = Path("/run/rwn-hosts")  # slot-<n>.lock, held (flock) for a cluster's life
SINK = "sink"  # in each host: a tun device no process reads, where DROPPED routes lead


class Block(enum.Enum):
    """How a host loses its way to an address: a route in the host's own table."""

    NO_ROUTE = "throw"
    """No route at all: ``connect`` fails at once with ENETUNREACH, "Network is unreachable", as on
    a compute node whose only routes are the cluster's network."""
    PROHIBITED = "prohibit"
    """A route that forbids it: ``connect`` fails at once with EACCES, "Permission denied", as
    where a site's policy says no."""
    DROPPED = "dropped"
    """Packets vanish (into a tun device that no process reads): ``connect`` and sends wait for
    their timeouts, as behind a firewall that drops; an open connection stalls."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return out.stdout


class Network:
    """The slot's bridge, hosts and routes (names and addresses are the slot's)."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.bridge = f"{PREFIX}{slot}"
        self.folder = Path(f"/tmp/{PREFIX}{slot}")  # short: Ray's socket paths live under it
        self._blocks: dict[str, dict[str, Block]] = {}

    def address(self, host: int) -> str:
        return f"198.18.{self.slot}.{host}"

    def netns(self, name: str) -> str:
        return f"{self.bridge}-{name}"

    def create_bridge(self) -> None:
        """The bridge, with the head's (.1) and the W&B backend's (.2) addresses on it."""
        _ip("link", "add", self.bridge, "type", "bridge")
        for host in (1, 2):
            _ip("addr", "add", f"{self.address(host)}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str, host: int) -> None:
        """The host's namespace: ``eth0`` at ``.<host>`` on the bridge, ``lo``, the sink; no other route."""
        ns, link = self.netns(name), self.netns(name)
        _ip("netns", "add", ns)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("addr", "add", f"{self.address(host)}/24", "dev", "eth0", netns=ns)
        for dev in ("lo", "eth0"):
            _ip("link", "set", dev, "up", netns=ns)
        # `ip tuntap` opens /dev/net/tun in the namespace it runs in: the device is made there.
        subprocess.run(["ip", "netns", "exec", ns, "ip", "tuntap", "add", "dev", SINK, "mode", "tun"], check=True)
        _ip("link", "set", SINK, "up", netns=ns)
        self._blocks[name] = {}

    def link(self, name: str, *, up: bool) -> None:
        """The machine's end of the host's veth up or down (down: the host is off the wire)."""
        _ip("link", "set", self.netns(name), "up" if up else "down")

    def block(self, name: str, address: str, how: Block) -> None:
        route = [f"{address}/32", "dev", SINK] if how is Block.DROPPED else [how.value, f"{address}/32"]
        _ip("route", "replace", *route, netns=self.netns(name))
        self._blocks[name][address] = how

    def unblock(self, name: str, address: str) -> None:
        if self._blocks[name].pop(address, None) is not None:
            _ip("route", "del", f"{address}/32", netns=self.netns(name))

    def blocks(self, name: str) -> dict[str, Block]:
        return dict(self._blocks[name])

    def shape(self, name: str, address: str, rate: str) -> None:
        """The host's traffic to ``address`` held to ``rate`` (tc's ``htb``, a class matched by
        destination; everything else as it was): a slow link. It goes with the namespace."""
        tc = ["ip", "netns", "exec", self.netns(name), "tc"]
        for args in (
            ["qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10"],
            ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
            ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", rate],
            ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
             "dst", f"{address}/32", "flowid", "1:20"],
        ):  # fmt: skip
            out = subprocess.run([*tc, *args], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join([*tc, *args])}: {out.stderr.strip()}")

    def unshape(self, name: str) -> None:
        """The host's link at its own speed again (nothing happens where it was not shaped)."""
        tc = ["ip", "netns", "exec", self.netns(name), "tc", "qdisc", "del", "dev", "eth0", "root"]
        subprocess.run(tc, capture_output=True, text=True)


def take_slot() -> tuple[int, IO[bytes]]:
    """A free slot (its lock held by the returned file) whose network the machine does not use;
    every other slot no process holds is swept of leftovers on the way."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    taken: tuple[int, IO[bytes]] | None = None
    for slot in range(SLOTS):
        lock = open(LOCKS / f"slot-{slot}.lock", "ab")  # held for the cluster's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()  # a live cluster's
            continue
        sweep_leftovers(slot)
        if taken is None and not _in_use(f"198.18.{slot}."):
            taken = (slot, lock)
        else:
            lock.close()
    if taken is None:
        raise RuntimeError(f"no free slot of {SLOTS} for a host cluster (198.18.0-15.0/24 all in use)")
    return taken


def _in_use(prefix: str) -> bool:
    """Whether the machine has an address or a route in ``prefix``."""
    text = _ip("-4", "-o", "addr", "show") + _ip("-4", "route", "show", "table", "all")
    return prefix in text


def sweep_leftovers(slot: int) -> None:
    """Remove whatever bears the slot's names: the processes of its namespaces and its head, the
    namespaces (their veths go with them), links on the machine, the hosts' memory cgroups, the folder."""
    bridge = f"{PREFIX}{slot}"
    namespaces = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    for ns in (n for n in namespaces if n.startswith(f"{bridge}-")):
        _kill(int(p) for p in _ip("netns", "pids", ns, check=False).split())
        _ip("netns", "del", ns, check=False)
    head_pid = Path(f"/tmp/{bridge}/head.pid")
    with contextlib.suppress(OSError, ValueError):
        pid = int(head_pid.read_text())
        if b"tests.support.host_init" in Path(f"/proc/{pid}/cmdline").read_bytes():
            _kill([pid])
    for line in _ip("-o", "link", "show").splitlines():
        name = re.split(r"[:@]", line.split(":", 1)[1].strip())[0]
        if name == bridge or name.startswith(f"{bridge}-"):
            _ip("link", "del", name, check=False)
    host_memory.sweep(slot)
    shutil.rmtree(f"/tmp/{bridge}", ignore_errors=True)


def _kill(pids: object) -> None:
    """SIGKILL each pid, then wait (up to 10 s) until none is left."""
    alive = []
    for pid in pids:  # type: ignore[attr-defined]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            alive.append(pid)
    deadline = time.monotonic() + 10
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and _state(p) != "Z"]
        time.sleep(0.05)


def _state(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return ""
