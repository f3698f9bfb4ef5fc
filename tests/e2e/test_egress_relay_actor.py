"""The relay's actor on a real cluster: on the driver's node (the Train controller's, in a run),
without a CPU, on the node's cluster address, answering only the run's token; stopped with the
run, and ended by Ray when the process that started it dies."""

from __future__ import annotations

import base64
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ray_wandb_nodes import _ray
from ray_wandb_nodes._egress import RelayOnNode, RelayRoute
from tests.support.wait import wait_until

pytestmark = [pytest.mark.cluster]
# The cluster: tests/e2e/conftest.py's two_nodes fixture (its head, the driver's node, has no CPU).
TOPOLOGY = "two_nodes"


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture(scope="module")
def upstream(cluster: Any) -> Iterator[str]:
    """An echo server on the driver node's address, standing in for the W&B host: its URL."""
    import ray

    server = socketserver.ThreadingTCPServer((ray.util.get_node_ip_address(), 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}"
    server.shutdown()
    server.server_close()


def tunnel(route: RelayRoute, target: str, token: str, timeout: float = 30) -> tuple[socket.socket, bytes]:
    """A tunnel to ``target`` through the relay at ``route`` with ``token``: the socket and the
    relay's answer (its head; what came before the peer closed, where it did)."""
    sock = socket.create_connection((route.host, route.port), timeout=timeout)
    auth = base64.b64encode(f"relay:{token}".encode()).decode()
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            break
        answer += byte
    return sock, answer


def relay_answers(route: RelayRoute, target: str, token: str) -> bool:
    """Whether a relay answers a tunnel with the token at ``route`` (anything else listening
    there, or nothing, does not)."""
    try:
        sock, answer = tunnel(route, target, token, timeout=5)
    except OSError:  # refused, reset, or silent for 5 s: no relay
        return False
    with sock:
        return answer.startswith(b"HTTP/1.1 200 ")


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_relay_runs_on_the_driver_s_node_without_a_cpu_and_stops_with_the_run(cluster: Any, upstream: str) -> None:
    import ray

    relay = RelayOnNode(upstream)
    relay.start()
    try:
        # The head has no CPU: an actor that asked for one would never be placed, and route() wait in vain.
        route = relay.route(60)
        assert route is not None and route.host == ray.util.get_node_ip_address()
        place = _ray.actor_location(relay.actor, 30)
        assert place is not None and place.node_id == ray.get_runtime_context().get_node_id()
        target = upstream.removeprefix("http://")
        sock, answer = tunnel(route, target, relay.token.reveal())
        assert answer == b"HTTP/1.1 200 Connection Established\r\n\r\n"
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        assert tunnel(route, target, "guess")[1].startswith(b"HTTP/1.1 407 ")
        stats = relay.stats(30)
        assert stats is not None and stats.tunnels == 1 and stats.refused == {"AUTH": 1}
    finally:
        final = relay.stop(30)
    assert final is not None and final.open == 0 and final.bytes_up == 4
    sock.settimeout(30)
    assert sock.recv(1) == b""  # the tunnel open at the run's end is closed
    assert not relay_answers(route, target, relay.token.reveal()) and relay.actor is None


def test_a_relay_that_dies_is_not_restarted_on_its_port_and_its_owner_learns_it(cluster: Any, upstream: str) -> None:
    import ray

    relay = RelayOnNode(upstream)
    relay.start()
    try:
        route = relay.route(60)
        assert route is not None and relay.gone() is None  # a live relay
        assert relay_answers(route, upstream.removeprefix("http://"), relay.token.reveal())
        ray.kill(relay.actor, no_restart=False)  # as its process dying: Ray may restart it, if asked to
        why = wait_until(relay.gone, 60, "the relay's owner to learn of its death")
        assert "died" in why
        # No relay answers on its port again: a restart would have bound it after a window in
        # which another process could take it, with the writers' token. (Another process of the
        # machine may listen there by now: Ray's workers take ports from the same ephemeral range.)
        assert not relay_answers(route, upstream.removeprefix("http://"), relay.token.reveal())
    finally:
        relay.stop(30)


def test_the_relay_ends_when_the_process_that_started_it_dies(cluster: Any, upstream: str) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.support.relay_driver", cluster.address, upstream],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        host, port = driver.stdout.readline().strip().rsplit(":", 1)
        assert not refused(host, int(port))  # it listens while its owner lives
        driver.send_signal(signal.SIGKILL)  # a crash: nothing stops the relay but Ray's ownership
        driver.wait(30)
        wait_until(lambda: refused(host, int(port)), 60, "the relay to end with its owner")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
