"""The check a node writer runs before it joins: each outcome against the real thing (a listener,
a closed port, a node's namespace with no route or a black hole, a TLS server, the relay), and
its bound."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._egress import Reach, RelayConfig, RelayThread, allow_list, check_reach, new_token
from ray_wandb_nodes._egress import reach as reach_module
from tests.support import netns, tls
from tests.support.netns import Netns, node_namespace

# The check returns at its deadline; a second more covers a loaded machine's scheduling.
SLACK_S = 1.0


class Listener:
    """A TCP listener on ``host`` that accepts and holds connections (TLS: handshakes them)."""

    def __init__(self, host: str, context: ssl.SSLContext | None = None, *, answer: bool = True) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.context, self.answer = context, answer
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            if self.context is not None and self.answer:
                threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        assert self.context is not None
        try:
            self.held.append(self.context.wrap_socket(conn, server_side=True))
        except (ssl.SSLError, OSError):
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener("127.0.0.1")
    yield server
    server.close()


def closed_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def test_a_listening_host_is_reachable(listener: Listener) -> None:
    found = check_reach(f"http://127.0.0.1:{listener.port}")
    assert found.reachable and found.error == "" and found.via is None
    assert found.describe() == f"127.0.0.1:{listener.port} reachable"


def test_a_closed_port_is_refused() -> None:
    found = check_reach(f"http://127.0.0.1:{closed_port()}")
    assert (found.outcome, found.error) == (Reach.REFUSED, "Connection refused")


def test_a_resolver_that_does_not_answer_is_timed_out_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = threading.Event()

    def stalled(*args: Any, **kwargs: Any) -> Any:
        answer.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(reach_module.socket, "getaddrinfo", stalled)
    try:
        found = check_reach("https://api.wandb.ai", timeout_s=0.3)
    finally:
        answer.set()
    assert found.outcome is Reach.TIMED_OUT and "resolving api.wandb.ai" in found.error
    assert found.seconds < 0.3 + SLACK_S


needs_netns = pytest.mark.skipif(netns.unsupported() is not None, reason=str(netns.unsupported()))


@pytest.fixture(scope="module")
def node() -> Iterator[Netns]:
    with node_namespace() as ns:
        yield ns


@needs_netns
@pytest.mark.parametrize(("how", "error"), [("no_route", "Network is unreachable"), ("prohibit", "Permission denied")])
def test_a_host_the_node_has_no_route_to_is_unreachable_at_once(node: Netns, how: netns.Block, error: str) -> None:
    server = Listener(node.wandb)
    try:
        url = f"http://{node.wandb}:{server.port}"
        assert node.call(check_reach, url).reachable  # the healthy node: the rule must not fire
        node.block(node.wandb, how)
        found = node.call(check_reach, url)
        assert (found.outcome, found.error) == (Reach.UNREACHABLE, error)
        assert found.seconds < SLACK_S
    finally:
        node.unblock(node.wandb)
        server.close()


@needs_netns
def test_a_black_holed_host_is_timed_out_at_the_deadline(node: Netns) -> None:
    server = Listener(node.wandb)
    node.block(node.wandb, "drop")
    try:
        found = node.call(lambda: check_reach(f"https://{node.wandb}:{server.port}", timeout_s=0.5))
    finally:
        node.unblock(node.wandb)
        server.close()
    assert found.outcome is Reach.TIMED_OUT and "no answer to the connection" in found.error
    assert 0.45 <= found.seconds < 0.5 + SLACK_S  # it waited for the deadline, and no longer


@needs_netns
def test_a_name_the_node_cannot_resolve_is_unreachable(node: Netns) -> None:
    # The node's only route is its /24: the machine's resolver is out of its reach, and
    # ".invalid" never resolves anywhere.
    found = node.call(check_reach, "https://api.example.invalid")
    assert found.outcome is Reach.UNREACHABLE and "does not resolve" in found.error


needs_openssl = pytest.mark.skipif(tls.unsupported() is not None, reason=str(tls.unsupported()))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tls.Certificate:
    return tls.make_certificate(Path(tmp_path_factory.mktemp("tls")), "127.0.0.1")


@needs_openssl
def test_a_tls_server_the_node_trusts_is_reachable_and_one_it_does_not_is_untrusted(
    certificate: tls.Certificate,
) -> None:
    server = Listener("127.0.0.1", certificate.server_context())
    try:
        url = f"https://127.0.0.1:{server.port}"
        assert check_reach(url, context=certificate.client_context()).reachable
        found = check_reach(url, context=ssl.create_default_context())  # the system's roots only
        assert found.outcome is Reach.UNTRUSTED and "certificate" in found.error
    finally:
        server.close()


@needs_openssl
def test_a_tls_handshake_that_never_finishes_is_timed_out(certificate: tls.Certificate) -> None:
    server = Listener("127.0.0.1", certificate.server_context(), answer=False)  # accepts, never answers
    try:
        found = check_reach(f"https://127.0.0.1:{server.port}", timeout_s=0.5, context=certificate.client_context())
    finally:
        server.close()
    assert found.outcome is Reach.TIMED_OUT and "TLS handshake" in found.error
    assert found.seconds < 0.5 + SLACK_S


def test_a_plain_server_where_tls_is_expected_is_refused() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer_http() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        conn.close()

    threading.Thread(target=answer_http, daemon=True).start()
    try:
        found = check_reach(f"https://127.0.0.1:{server.getsockname()[1]}")
    finally:
        server.close()
    assert found.outcome is Reach.REFUSED and found.error.startswith("TLS")


class Upstreams:
    """What the relay in these tests tunnels to: an HTTP server (it answers every request 404, as
    a W&B server answers a path it does not serve), a TLS listener, and a port nobody listens on."""

    def __init__(self, certificate: tls.Certificate) -> None:
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.secure = Listener("127.0.0.1", certificate.server_context())
        self.closed = closed_port()

    def hosts(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in (self.http.server_address[1], self.secure.port, self.closed)]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.secure.close()


@pytest.fixture(scope="module")
def relay(certificate: tls.Certificate) -> Iterator[tuple[RelayThread, Upstreams]]:
    upstreams = Upstreams(certificate)
    thread = RelayThread(RelayConfig(allow_list(None, upstreams.hosts()), new_token(), "127.0.0.1"))
    thread.start()
    yield thread, upstreams
    thread.stop()
    upstreams.close()


def proxy_url(relay: RelayThread, token: str | None = None) -> str:
    assert relay.address is not None
    host, port = relay.address
    return f"http://relay:{token or relay.config.token.reveal()}@{host}:{port}"


@needs_openssl
def test_through_the_relay_an_allowed_host_is_reachable_over_https_and_http(
    relay: tuple[RelayThread, Upstreams], certificate: tls.Certificate
) -> None:
    thread, up = relay
    assert thread.address is not None
    found = check_reach(
        f"https://127.0.0.1:{up.secure.port}", proxy=proxy_url(thread), context=certificate.client_context()
    )
    assert found.reachable and found.via == f"127.0.0.1:{thread.address[1]}"
    # An http:// server: one request in absolute form; the server's 404 is its own answer.
    plain = check_reach(f"http://127.0.0.1:{up.http.server_address[1]}", proxy=proxy_url(thread))
    assert plain.reachable and thread.stats().forwarded == 1


@needs_openssl
def test_through_the_relay_a_wrong_token_a_host_off_the_list_or_a_dead_one_is_not_reachable(
    relay: tuple[RelayThread, Upstreams], certificate: tls.Certificate
) -> None:
    thread, up = relay
    ctx = certificate.client_context()
    wrong = check_reach(f"https://127.0.0.1:{up.secure.port}", proxy=proxy_url(thread, "guess"), context=ctx)
    assert wrong.outcome is Reach.REFUSED and "407" in wrong.error
    off = check_reach(f"https://localhost:{up.secure.port}", proxy=proxy_url(thread), context=ctx)
    assert off.outcome is Reach.REFUSED and "403" in off.error
    dead = check_reach(f"https://127.0.0.1:{up.closed}", proxy=proxy_url(thread), context=ctx)
    assert dead.outcome is Reach.UNREACHABLE and "502" in dead.error


def test_a_proxy_that_is_not_there_is_refused_and_says_it_was_the_proxy() -> None:
    found = check_reach("https://api.wandb.ai", proxy=f"http://127.0.0.1:{closed_port()}")
    assert found.outcome is Reach.REFUSED and found.error == "the proxy: Connection refused"
