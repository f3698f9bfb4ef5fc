"""A node of the test's own in a network namespace, for tests of what a node sees of the network
(the reachability check, the relay with the real wandb client) without a Ray cluster.

Topology (``k`` is the slot, 0-63; 198.19.0.0/16 is the upper half of RFC 2544's benchmarking
range, which no real network routes; ``tests/support/host_net.py``'s clusters use 198.18.x)::

    the machine (root namespaces)                  the namespace rwne<k> (a node)
      198.19.<k>.1  the head: the relay listens     eth0 198.19.<k>.10/24, lo up,
      198.19.<k>.2  W&B: the test backend            sink: a tun device no process reads
           on the veth rwne<k>h ──────────────────── eth0

The node has one route, the /24; :meth:`Netns.block` takes its way to one address away: no route
(``connect`` fails at once, ENETUNREACH), a prohibiting route (EACCES), or into the sink (packets
vanish: ``connect`` waits for its timeout). Code runs inside with :meth:`Netns.command` (a
process) or :meth:`Netns.call` (a function on a thread that entered the namespace).

Cleanup: every process left in the namespace is killed, the namespace and the veth are deleted,
by :meth:`Netns.stop` (the fixture's finaliser, and ``atexit``), also when a test fails; a slot is
held by a lock while it lives, and a slot no process holds is swept of what a crashed run left.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Literal, TypeVar

from tests.support.host_net import _ip

T = TypeVar("T")
PREFIX = "rwne"
SLOTS = 64
LOCKS = Path("/run/rwn-egress")
CLONE_NEWNET = 0x40000000
HEAD, WANDB, NODE = 1, 2, 10
Block = Literal["no_route", "prohibit", "drop"]


def unsupported() -> str | None:
    """Why this machine cannot make the namespaces, or None when it can."""
    if not os.path.exists("/proc/self/ns/net"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need the ip tool (Debian: apt-get install iproute2)"
    if not Path("/dev/net/tun").exists():
        return "a black-holed address needs /dev/net/tun"
    return None


class Netns:
    """One node namespace and its veth; :meth:`start` makes them, :meth:`stop` removes them."""

    def __init__(self) -> None:
        self.slot = -1
        self._lock: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.slot}"

    def address(self, host: int) -> str:
        return f"198.19.{self.slot}.{host}"

    @property
    def head(self) -> str:
        """The machine's address the node reaches (where a relay listens)."""
        return self.address(HEAD)

    @property
    def wandb(self) -> str:
        """The machine's address for the W&B backend (the node's way to it can be blocked)."""
        return self.address(WANDB)

    @property
    def node(self) -> str:
        return self.address(NODE)

    def start(self) -> Netns:
        self.slot, self._lock = _take_slot()
        _LIVE.add(self)
        ns, veth = self.name, f"{self.name}h"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        for host in (HEAD, WANDB):
            _ip("addr", "add", f"{self.address(host)}/24", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("addr", "add", f"{self.node}/24", "dev", "eth0", netns=ns)
        for dev in ("lo", "eth0"):
            _ip("link", "set", dev, "up", netns=ns)
        # `ip tuntap` opens /dev/net/tun in the namespace it runs in: the device is made there.
        subprocess.run(["ip", "netns", "exec", ns, "ip", "tuntap", "add", "dev", "sink", "mode", "tun"], check=True)
        _ip("link", "set", "sink", "up", netns=ns)
        return self

    def stop(self) -> None:
        if self.slot < 0:
            return
        _sweep(self.slot)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        _LIVE.discard(self)
        self.slot = -1

    def block(self, address: str, how: Block) -> None:
        """From now on the node cannot reach ``address``, as ``how`` says."""
        if how == "drop":
            route = [f"{address}/32", "dev", "sink"]
        else:
            route = ["throw" if how == "no_route" else "prohibit", f"{address}/32"]
        _ip("route", "replace", *route, netns=self.name)

    def unblock(self, address: str) -> None:
        _ip("route", "del", f"{address}/32", netns=self.name, check=False)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside the node's network namespace (the rest is the machine's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def call(self, fn: Callable[..., T], *args: object, timeout_s: float = 60) -> T:
        """``fn(*args)`` on a thread that entered the namespace: every socket it makes is the
        node's. Its exceptions are raised here."""
        box: list[tuple[bool, object]] = []

        def run() -> None:
            try:
                fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
                box.append((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.append((False, e))

        thread = threading.Thread(target=run, name=f"in-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if not box:
            raise TimeoutError(f"{fn} did not return within {timeout_s} s in {self.name}")
        ok, value = box[0]
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]


_LIVE: set[Netns] = set()


@atexit.register
def _stop_all() -> None:
    for netns in list(_LIVE):
        netns.stop()


@contextlib.contextmanager
def node_namespace() -> Iterator[Netns]:
    netns = Netns()
    try:
        yield netns.start()
    finally:
        netns.stop()


def _take_slot() -> tuple[int, IO[bytes]]:
    """A free slot, its lock held by the returned file; slots no process holds are swept."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    used = _ip("-4", "-o", "addr", "show") + _ip("-4", "route", "show", "table", "all")
    for slot in range(SLOTS):
        lock = open(LOCKS / f"slot-{slot}.lock", "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _sweep(slot)
        if f"198.19.{slot}." in used and f"{PREFIX}{slot}h" not in used:
            lock.close()  # the machine uses this /24 for something else
            continue
        return slot, lock
    raise RuntimeError(f"no free slot of {SLOTS} for a node namespace")


def _sweep(slot: int) -> None:
    ns = f"{PREFIX}{slot}"
    if ns in _ip("netns", "list").split():
        for pid in _ip("netns", "pids", ns, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _ip("netns", "pids", ns, check=False).strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)
    _ip("link", "del", f"{ns}h", check=False)  # gone with the namespace, unless it was never moved
