"""The relay as a co-tenant of a shared cluster meets it, from raw sockets: what a client without
the token can cost it, what a token holder's request can reach, and heads a proxy must refuse.
(The same on hosts of their own, during a run: ``tests/e2e/test_hosts.py``.)"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ray_wandb_nodes._egress import RelayThread, allow_list
from tests.support.wait import wait_until
from tests.unit.egress.test_relay import TOKEN, _Echo, _Http, ask, auth, connect, read_all, read_response, start
from tests.unit.egress.test_relay import upstreams as upstreams  # the module's fixture

REQUESTS = 300  # unauthenticated requests, each for another host


def strings_in(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[str]:
    """Every string reachable from ``obj`` through containers and instance attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings_in(k, depth + 1, seen)
            yield from strings_in(v, depth + 1, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from strings_in(v, depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, asyncio.AbstractEventLoop, logging.Logger)):
        yield from strings_in(vars(obj), depth + 1, seen)


def test_requests_without_the_token_for_many_hosts_leave_no_state_and_a_bounded_log(
    upstreams: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ray_wandb_nodes._egress")
    relay = start(upstreams)
    hosts = [f"{secrets.token_hex(20)}.example" for _ in range(REQUESTS)]
    try:
        for host in hosts:
            assert read_all(ask(relay, f"CONNECT {host}:1 HTTP/1.1")).startswith(b"HTTP/1.1 407 ")
        kept = set(strings_in(relay))
        assert not any(host in text for text in kept for host in hosts[:20])  # nothing of theirs stays
        assert relay.stats().refused == {"AUTH": REQUESTS}
        assert getattr(relay.stats(), "refused_hosts", {}) == {}  # hosts are kept for token holders only
    finally:
        relay.stop()
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(lines) <= 10, len(lines)  # ten a minute at most, not one a request


def test_a_refusal_s_log_line_escapes_and_cuts_the_host(
    upstreams: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ray_wandb_nodes._egress")
    relay = start(upstreams)
    long = ".".join(["a" * 60] * 4) + ".example"  # a valid name of 252 characters
    try:
        read_all(ask(relay, f"CONNECT {long}:1 HTTP/1.1"))
    finally:
        relay.stop()
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert long not in line and "'" + "a" * 60 in line and len(line) < 150


def test_silent_sockets_past_max_connections_do_not_starve_a_writer(upstreams: dict[str, Any]) -> None:
    relay = start(upstreams, max_connections=8)
    assert relay.address is not None
    silent = [socket.create_connection(relay.address, timeout=10) for _ in range(40)]
    try:
        wait_until(lambda: relay.stats().accepted >= 40, 10, "the relay to accept the silent sockets")
        sock, answer = connect(relay, upstreams["echo"])
        assert answer.startswith(b"HTTP/1.1 200 ")
        sock.close()
    finally:
        for s in silent:
            s.close()
        relay.stop()


def test_a_full_budget_before_the_token_closes_its_oldest_silent_socket(upstreams: dict[str, Any]) -> None:
    relay = start(upstreams, unauthenticated_per_peer=4, unauthenticated_total=8)
    assert relay.address is not None
    silent = [socket.create_connection(relay.address, timeout=10) for _ in range(20)]
    try:
        wait_until(lambda: relay.stats().accepted >= 20, 10, "the relay to accept the silent sockets")
        assert silent[0].recv(1) == b""  # the oldest made room; the newest four still wait
        _, answer = connect(relay, upstreams["echo"])
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert relay.stats().refused.get("EVICTED", 0) >= 16
    finally:
        for s in silent:
            s.close()
        relay.stop()


@pytest.mark.parametrize(("nodes", "served"), [(["10.255.0.9"], False), (["10.255.0.9", "127.0.0.1"], True)])
def test_only_the_cluster_s_nodes_are_served(upstreams: dict[str, Any], nodes: list[str], served: bool) -> None:
    relay = start(upstreams, peers=lambda: nodes)
    try:
        _, answer = connect(relay, upstreams["echo"])
        assert answer.startswith(b"HTTP/1.1 200 ") if served else answer == b""
        assert ("NOT_A_NODE" in relay.stats().refused) is not served
    finally:
        relay.stop()


def test_a_plain_http_request_names_its_host_in_host_whatever_the_client_wrote(upstreams: dict[str, Any]) -> None:
    host, port = upstreams["http"]
    relay = start(upstreams)
    _Http.seen.clear()
    try:
        sock = ask(
            relay,
            f"POST http://{host}:{port}/graphql HTTP/1.1",
            "Host: internal-admin.example",  # another host behind a shared ingress
            auth(),
            "Content-Length: 2",
            body=b"{}",
        )
        assert read_response(sock)[0].startswith(b"HTTP/1.1 200 ")
    finally:
        relay.stop()
    [(_, headers, body)] = _Http.seen
    assert headers["Host"] == f"{host}:{port}" and body == b"{}"


def test_a_connection_header_cannot_strip_the_framing(upstreams: dict[str, Any]) -> None:
    host, port = upstreams["http"]
    relay = start(upstreams)
    _Http.seen.clear()
    try:
        sock = ask(
            relay,
            f"POST http://{host}:{port}/graphql HTTP/1.1",
            auth(),
            "Connection: Content-Length, X-Hop",
            "X-Hop: 1",
            "Content-Length: 5",
            body=b"hello",
        )
        assert read_response(sock)[0].startswith(b"HTTP/1.1 200 ")
    finally:
        relay.stop()
    [(_, headers, body)] = _Http.seen
    assert body == b"hello" and headers["Content-Length"] == "5" and "X-Hop" not in headers


@pytest.mark.parametrize(
    "header",
    ["X-A: a\x00b", "X-A: a\x01b", "X-A: a\nb", "X-A: a\x1b[31mred"],
    ids=["NUL", "control", "bare LF", "escape"],
)
def test_a_header_value_with_a_control_character_is_refused(upstreams: dict[str, Any], header: str) -> None:
    host, port = upstreams["http"]
    relay = start(upstreams)
    _Http.seen.clear()
    try:
        sock = ask(relay, f"POST http://{host}:{port}/graphql HTTP/1.1", auth(), header, "Content-Length: 0")
        assert read_all(sock).startswith(b"HTTP/1.1 400 ")
        assert _Http.seen == []
    finally:
        relay.stop()


def test_a_head_with_both_framings_is_refused(upstreams: dict[str, Any]) -> None:
    host, port = upstreams["http"]
    relay = start(upstreams)
    try:
        sock = ask(
            relay,
            f"POST http://{host}:{port}/graphql HTTP/1.1",
            auth(),
            "Content-Length: 5",
            "Transfer-Encoding: chunked",
            body=b"0\r\n\r\n",
        )
        assert read_all(sock).startswith(b"HTTP/1.1 400 ")
    finally:
        relay.stop()


@pytest.mark.parametrize(
    "target",
    ["a.b:\u00b2", "x..s3.corp.example:443", "a" * 64 + ".s3.corp.example:443", "\u00e9.s3.corp.example:443"],
    ids=["superscript port", "empty label", "long label", "not ASCII"],
)
def test_a_malformed_host_or_port_is_answered_400_never_dropped(upstreams: dict[str, Any], target: str) -> None:
    hosts = [f"{h}:{p}" for h, p in upstreams.values()] + ["*.s3.corp.example"]
    from ray_wandb_nodes._egress import RelayConfig, new_token

    token = new_token()
    relay = RelayThread(RelayConfig(allow_list("http://127.0.0.1:9", hosts), token, "127.0.0.1"))
    relay.start()
    try:
        assert relay.address is not None
        sock = socket.create_connection(relay.address, timeout=10)
        line = f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n{auth(token)}\r\n\r\n"
        sock.sendall(line.encode("latin-1"))  # "²" as one byte, as str.isdigit() and int() see it
        assert read_all(sock).startswith(b"HTTP/1.1 400 ")
    finally:
        relay.stop()


def test_an_allowed_name_that_resolves_to_loopback_is_refused(upstreams: dict[str, Any]) -> None:
    _, port = upstreams["echo"]
    relay = start(upstreams)  # lists 127.0.0.1:<echo>, the address itself
    named = RelayThread(
        type(relay.config)(allow_list("http://wandb.invalid", [f"localhost:{port}"]), relay.config.token, "127.0.0.1")
    )
    named.start()
    try:
        assert connect(relay, ("127.0.0.1", port))[1].startswith(b"HTTP/1.1 200 ")  # listed as an address
        assert connect(named, ("localhost", port))[1].startswith(b"HTTP/1.1 403 ")  # a name that resolves there
    finally:
        relay.stop()
        named.stop()


@pytest.mark.parametrize("no_proxy", ["", "yes"], ids=["through it", "NO_PROXY names the host"])
def test_the_relay_goes_through_the_site_s_proxy(upstreams: dict[str, Any], no_proxy: str) -> None:
    from ray_wandb_nodes._config.secrets import Secret
    from ray_wandb_nodes._egress import RelayConfig, RelayRoute, new_token

    # A proxy is never used for a loopback host (Go's rule, which the relay keeps): the echo
    # server listens on this machine's address on its network.
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))  # no packet is sent: the kernel picks the source address
        here = probe.getsockname()[0]
    except OSError:
        here = "127.0.0.1"  # no route anywhere
    finally:
        probe.close()
    if here.startswith("127."):
        pytest.skip("this machine has no address but loopback")
    echo = socketserver.ThreadingTCPServer((here, 0), _Echo)
    echo.daemon_threads = True
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    target = echo.server_address[:2]
    site_token = new_token()  # the site's proxy: another relay, with credentials of its own
    hosts = [f"{h}:{p}" for h, p in [target, *upstreams.values()]]
    site = RelayThread(RelayConfig(allow_list("http://127.0.0.1:9", hosts), site_token, "127.0.0.1"))
    site.start()
    assert site.address is not None
    env = {"HTTPS_PROXY": RelayRoute(*site.address, site_token).proxy_url(), "NO_PROXY": no_proxy and here}
    relay = RelayThread(
        RelayConfig(allow_list("http://127.0.0.1:9", hosts), TOKEN, "127.0.0.1",
                    proxy_env=tuple((k, Secret(v)) for k, v in env.items() if v))
    )  # fmt: skip
    relay.start()
    try:
        sock, answer = connect(relay, target)
        assert answer.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        sock.close()
        assert site.stats().tunnels == (0 if no_proxy else 1)
    finally:
        relay.stop()
        site.stop()
        echo.shutdown()


def test_the_relay_s_bounds_fit_the_descriptors_its_process_may_open(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray_wandb_nodes._egress import RelayConfig, actor

    config = RelayConfig(allow_list(None), TOKEN, "127.0.0.1")
    monkeypatch.setattr(actor, "raise_descriptor_limit", lambda wanted: 1024)  # a hard limit of 1,024
    fitted = actor.fit_descriptors(config)
    need = 2 * fitted.max_connections + fitted.unauthenticated_total
    assert need <= 1024 - 256 and fitted.max_connections >= 256
    monkeypatch.setattr(actor, "raise_descriptor_limit", lambda wanted: wanted)
    assert actor.fit_descriptors(config) == config  # room enough: as configured
