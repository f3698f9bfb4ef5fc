"""The relay on its own, from raw sockets: what it carries, whom and where it refuses, its bounds,
its stop, and what it logs. (The real wandb client through it: ``test_relay_with_wandb.py``.)"""

from __future__ import annotations

import base64
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ray_wandb_nodes._config.secrets import Secret
from ray_wandb_nodes._egress import RelayConfig, RelayThread, allow_list, new_token
from tests.support.wait import wait_until

TOKEN = new_token()


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Http(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str], bytes]] = []

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Http.seen.append((self.requestline, dict(self.headers.items()), body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, tuple[str, int]]]:
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    http = ThreadingHTTPServer(("127.0.0.1", 0), _Http)
    for server in (echo, http):
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
    yield {"echo": echo.server_address[:2], "http": http.server_address[:2], "closed": closed.getsockname()[:2]}
    for server in (echo, http):
        server.shutdown()
    closed.close()


def start(upstreams: dict[str, tuple[str, int]], **bounds: Any) -> RelayThread:
    hosts = [f"{h}:{p}" for h, p in upstreams.values()]
    relay = RelayThread(RelayConfig(allow_list("http://127.0.0.1:9", hosts), TOKEN, "127.0.0.1", **bounds))
    relay.start()
    return relay


@pytest.fixture
def relay(upstreams: dict[str, tuple[str, int]]) -> Iterator[RelayThread]:
    r = start(upstreams)
    yield r
    r.stop()


def auth(token: Secret = TOKEN) -> str:
    return "Proxy-Authorization: Basic " + base64.b64encode(f"relay:{token.reveal()}".encode()).decode()


def ask(relay: RelayThread, *lines: str, body: bytes = b"") -> socket.socket:
    """Send a head (with the ``Host`` every HTTP/1.1 request carries, where ``lines`` has none)."""
    assert relay.address is not None
    target = lines[0].split(" ")[1] if len(lines[0].split(" ")) == 3 else ""
    if target and not any(line.lower().startswith("host:") for line in lines):
        lines = (lines[0], "Host: " + target.removeprefix("http://").split("/")[0], *lines[1:])
    sock = socket.create_connection(relay.address, timeout=10)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
    return data


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """An answer's head and its body (by its Content-Length), as a client reads it."""
    head = read_head(sock)
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return head, body


def connect(relay: RelayThread, target: tuple[str, int], *, token: Secret = TOKEN) -> tuple[socket.socket, bytes]:
    sock = ask(relay, f"CONNECT {target[0]}:{target[1]} HTTP/1.1", auth(token))
    return sock, read_head(sock)


def test_a_tunnel_carries_bytes_both_ways_and_counts_them(relay: RelayThread, upstreams: dict[str, Any]) -> None:
    sock, answer = connect(relay, upstreams["echo"])
    assert answer == b"HTTP/1.1 200 Connection Established\r\n\r\n"
    payload = bytes(range(256)) * 1000
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += sock.recv(65536)
    assert got == payload
    sock.close()
    stats = wait_until(lambda: (s := relay.stats()).open == 0 and s, 10, "the tunnel to close")
    assert (stats.tunnels, stats.forwarded, stats.bytes_up, stats.bytes_down) == (1, 0, len(payload), len(payload))
    assert stats.hosts == {"{}:{}".format(*upstreams["echo"]): 1} and stats.refused == {}


def test_a_plain_http_request_is_sent_on_in_origin_form_and_its_answer_closes_the_connection(
    relay: RelayThread, upstreams: dict[str, Any]
) -> None:
    host, port = upstreams["http"]
    _Http.seen.clear()
    sock = ask(
        relay,
        f"POST http://{host}:{port}/files/e/p/run/file_stream HTTP/1.1",
        f"Host: {host}:{port}",
        auth(),
        "Proxy-Connection: keep-alive",
        "Content-Length: 5",
        body=b"hello",
    )
    answer, body = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and body == b"ok"
    # The server said keep-alive; the client is told the connection closes, and closes it.
    assert b"Connection: close\r\n" in answer and b"keep-alive" not in answer
    sock.close()
    wait_until(lambda: relay.stats().open == 0, 10, "the relay to close the connection")
    [(line, headers, body)] = _Http.seen
    assert line == "POST /files/e/p/run/file_stream HTTP/1.1" and body == b"hello"
    assert headers["Connection"] == "close"
    assert not {"Proxy-Authorization", "Proxy-Connection"} & set(headers)
    assert relay.stats().forwarded == 1


@pytest.mark.parametrize("token", [None, Secret("not-the-token")], ids=["none", "wrong"])
def test_a_client_without_the_run_s_token_is_answered_407(
    relay: RelayThread, upstreams: dict[str, Any], token: Secret | None
) -> None:
    host, port = upstreams["echo"]
    lines = [f"CONNECT {host}:{port} HTTP/1.1"] + ([auth(token)] if token else [])
    answer = read_all(ask(relay, *lines))
    assert answer.startswith(b"HTTP/1.1 407 ") and b"Proxy-Authenticate: Basic" in answer
    assert relay.stats().refused == {"AUTH": 1} and relay.stats().tunnels == 0


@pytest.mark.parametrize(
    "target", ["localhost:{echo}", "127.0.0.1:{free}", "127.0.0.2:{echo}"], ids=["another name", "port", "address"]
)
def test_a_host_or_port_not_on_the_allow_list_is_answered_403(
    relay: RelayThread, upstreams: dict[str, Any], target: str
) -> None:
    free = upstreams["echo"][1] + 1 if upstreams["echo"][1] < 65535 else 1
    where = target.format(echo=upstreams["echo"][1], free=free)
    assert read_all(ask(relay, f"CONNECT {where} HTTP/1.1", auth())).startswith(b"HTTP/1.1 403 ")
    host, _ = upstreams["http"]
    forward = ask(relay, f"POST http://{host}:{free}/graphql HTTP/1.1", auth(), "Content-Length: 0")
    assert read_all(forward).startswith(b"HTTP/1.1 403 ")
    assert relay.stats().refused == {"NOT_ALLOWED": 2} and relay.stats().hosts == {}


def test_an_allowed_host_that_does_not_answer_is_answered_502(relay: RelayThread, upstreams: dict[str, Any]) -> None:
    _, answer = connect(relay, upstreams["closed"])
    assert answer.startswith(b"HTTP/1.1 502 ")


def test_a_malformed_or_oversized_head_is_refused(relay: RelayThread) -> None:
    assert read_all(ask(relay, "GET /graphql HTTP/1.1", auth())).startswith(b"HTTP/1.1 400 ")
    huge = ask(relay, "CONNECT a:1 HTTP/1.1", "X: " + "a" * 20000)
    assert read_all(huge).startswith(b"HTTP/1.1 431 ")


def test_a_connection_idle_past_the_bound_is_closed(upstreams: dict[str, Any]) -> None:
    relay = start(upstreams, idle_timeout_s=0.3)
    try:
        sock, _ = connect(relay, upstreams["echo"])
        sock.settimeout(30)
        assert sock.recv(1) == b""  # the relay closed it: nothing was sent either way
        assert relay.stats().idle_closed == 1
    finally:
        relay.stop()


def test_a_connection_in_use_outlives_the_idle_bound(upstreams: dict[str, Any]) -> None:
    # Twelve round trips 0.25 s apart span 3 s, past the 2.5 s bound: a bound counted from the
    # connection's start would close it. A round trip would have to stall over 2.25 s (nine
    # times its gap) for an idle close: the margin a loaded 2-core machine needs.
    relay = start(upstreams, idle_timeout_s=2.5)
    try:
        sock, _ = connect(relay, upstreams["echo"])
        for i in range(12):
            sock.sendall(bytes([i]))
            assert sock.recv(1) == bytes([i])
            time.sleep(0.25)
        assert relay.stats().idle_closed == 0 and relay.stats().open == 1
    finally:
        relay.stop()


def test_a_client_past_max_connections_is_answered_503(upstreams: dict[str, Any]) -> None:
    relay = start(upstreams, max_connections=2)
    try:
        held = [connect(relay, upstreams["echo"])[0] for _ in range(2)]
        assert read_all(ask(relay, "CONNECT a:1 HTTP/1.1", auth())).startswith(b"HTTP/1.1 503 ")
        held[0].close()
        wait_until(lambda: relay.stats().open == 1, 10, "a connection to close")
        _, answer = connect(relay, upstreams["echo"])
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert relay.stats().peak == 2 and relay.stats().refused == {"BUSY": 1}
    finally:
        relay.stop()


def test_stopping_closes_every_connection_and_the_listener(upstreams: dict[str, Any]) -> None:
    relay = start(upstreams)
    sock, _ = connect(relay, upstreams["echo"])
    assert relay.address is not None
    final = relay.stop()
    sock.settimeout(30)
    assert sock.recv(1) == b""
    assert final.open == 0 and final.tunnels == 1 and not relay.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(relay.address, timeout=5)


def test_the_relay_logs_host_names_only(upstreams: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ray_wandb_nodes._egress")
    relay = start(upstreams)
    try:
        host, port = upstreams["http"]
        read_response(
            ask(relay, f"POST http://{host}:{port}/files/secret-run/file_stream HTTP/1.1", auth(), "Content-Length: 0")
        )
        read_all(
            ask(relay, f"POST http://{host}:{port}/other/path HTTP/1.1", auth(Secret("guess")), "Content-Length: 0")
        )
        read_all(ask(relay, "CONNECT evil.example:443 HTTP/1.1", auth()))
    finally:
        relay.stop()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{host}:{port}" in text and "evil.example:443" in text
    for secret in (TOKEN.reveal(), "guess", "secret-run", "file_stream", "/other/path", "Proxy-Authorization"):
        assert secret not in text
