"""The test hosts' network (``tests/support/host_net.py``) without Ray: what each ``Block`` does to
a host's connections, an open connection across a block and back, and the sweep that leaves
nothing (these need root and ``ip``: skipped with the reason elsewhere, a few seconds); and the
reasons the multi-host tests give where they cannot run."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import hosts
from tests.support.host_net import PREFIX, Block, Network, sweep_leftovers, take_slot
from tests.support.hosts import unsupported

needs_hosts = pytest.mark.skipif(bool(unsupported()), reason=unsupported() or "")

# Connects to argv[1]:argv[2] from inside a host; prints what became of it.
PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(1.0)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as e:
    print(type(e).__name__, e.errno)
"""

# An open connection: an echo, then one per line the test writes, each reported.
CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
for n, line in enumerate(sys.stdin):
    s.sendall(b"x")
    s.settimeout(float(line))
    try:
        print("echo" if s.recv(1) == b"x" else "closed", flush=True)
    except TimeoutError:
        print("stalled", flush=True)
"""


@contextlib.contextmanager
def one_host() -> Iterator[tuple[Network, str]]:
    """A slot's bridge and one host namespace at .10, swept on the way out."""
    slot, lock = take_slot()
    network = Network(slot)
    try:
        network.create_bridge()
        network.add_host("t", 10)
        yield network, network.netns("t")
    finally:
        sweep_leftovers(slot)
        lock.close()


@contextlib.contextmanager
def echo_server(address: str) -> Iterator[int]:
    """A TCP echo server on ``address`` (the machine's side of the bridge); its port."""
    server = socket.create_server((address, 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):  # a client killed at the test's end resets it
                while data := conn.recv(64):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def in_host(netns: str, script: str, *args: object) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, "-c", script, *map(str, args)]


def test_without_root_the_reason_says_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    assert unsupported() == "the multi-host tests need root (network, UTS, mount and PID namespaces, a bridge)"


def test_without_a_tool_the_reason_names_it_and_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hosts.shutil, "which", lambda tool: None if tool in ("nsenter", "setpriv") else f"/bin/{tool}")
    reason = unsupported()
    assert reason == "the multi-host tests need nsenter, setpriv (Debian: apt-get install iproute2 util-linux)"


@needs_hosts
def test_each_block_fails_a_connect_as_it_says_and_unblocking_reaches_the_address_again() -> None:
    with one_host() as (network, netns), echo_server(network.address(2)) as port:
        wandb = network.address(2)

        def probe() -> str:
            return subprocess.run(in_host(netns, PROBE, wandb, port), capture_output=True, text=True).stdout.strip()

        assert probe() == "connected"
        network.block("t", wandb, Block.NO_ROUTE)
        assert probe() == "OSError 101"  # ENETUNREACH: "Network is unreachable"
        network.block("t", wandb, Block.PROHIBITED)
        assert probe() == "PermissionError 13"  # EACCES
        network.block("t", wandb, Block.DROPPED)
        assert probe() == "TimeoutError None"  # nothing comes back: the 1 s timeout
        assert network.blocks("t") == {wandb: Block.DROPPED}
        network.unblock("t", wandb)
        assert probe() == "connected" and network.blocks("t") == {}
        # Blocking one address leaves the others: the head's stays reachable.
        network.block("t", wandb, Block.NO_ROUTE)
        with echo_server(network.address(1)) as head_port:
            reach_head = in_host(netns, PROBE, network.address(1), head_port)
            assert subprocess.run(reach_head, capture_output=True, text=True).stdout.strip() == "connected"


@needs_hosts
def test_an_open_connection_stalls_while_dropped_and_carries_on_once_unblocked() -> None:
    with one_host() as (network, netns), echo_server(network.address(2)) as port:
        client = subprocess.Popen(
            in_host(netns, CLIENT, network.address(2), port), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert client.stdin is not None and client.stdout is not None
        try:

            def exchange(wait_s: float) -> str:
                client.stdin.write(f"{wait_s}\n")  # type: ignore[union-attr]
                client.stdin.flush()  # type: ignore[union-attr]
                return client.stdout.readline().strip()  # type: ignore[union-attr]

            assert exchange(5) == "echo"
            network.block("t", network.address(2), Block.DROPPED)
            assert exchange(1) == "stalled"
            network.unblock("t", network.address(2))
            # TCP sends the unanswered byte again (its retransmission timer, 1 s and doubling),
            # then the new one: both echoes come back on the same connection.
            assert exchange(10) == "echo"
        finally:
            client.kill()
            client.wait()


@needs_hosts
def test_the_sweep_leaves_no_namespace_link_or_folder_of_the_slot() -> None:
    with one_host() as (network, netns):
        network.folder.mkdir()
        slot = network.slot
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert netns not in names
    assert f" {PREFIX}{slot}:" not in links and f" {PREFIX}{slot}-" not in links
    assert not Path(f"/tmp/{PREFIX}{slot}").exists()
