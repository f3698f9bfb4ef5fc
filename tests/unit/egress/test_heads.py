"""How the relay reads a client's request head, whom it answers, and what it sends on."""

from __future__ import annotations

import base64

import pytest

from ray_wandb_nodes._egress.allow import Endpoint
from ray_wandb_nodes._egress.heads import HeadParser, Refusal, RefusalError, authorized, parse_head


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def test_connect_names_its_host_and_port() -> None:
    h = parse_head(head("CONNECT api.wandb.ai:443 HTTP/1.1", "Host: api.wandb.ai:443", "User-Agent: Go"))
    assert (h.method, h.target, h.tunnel, h.path) == ("CONNECT", Endpoint("api.wandb.ai", 443), True, "")
    v6 = parse_head(head("CONNECT [2001:db8::1]:8443 HTTP/1.1", "Host: [2001:db8::1]:8443"))
    assert v6.target == Endpoint("2001:db8::1", 8443)


def test_a_tunnel_s_first_bytes_after_its_head_are_kept_and_a_long_head_is_cut_at_16_kib() -> None:
    parser = HeadParser()
    assert parser.feed(b"CONNECT a.b:443 HTTP/1.1\r\nHo") is None
    assert parser.feed(b"st: a.b:443\r\n\r\n\x16\x03\x01") is not None
    assert parser.pending == b"\x16\x03\x01"  # a TLS ClientHello sent before the answer goes on
    with pytest.raises(RefusalError) as e:  # one read of a whole 20 KiB head: h11 sees 16 KiB of it
        HeadParser().feed(head("CONNECT a.b:443 HTTP/1.1", "Host: a.b:443", "X: " + "a" * 20000))
    assert e.value.refusal is Refusal.HEAD_TOO_LARGE


def test_a_plain_http_request_names_its_host_and_is_sent_on_in_origin_form() -> None:
    h = parse_head(
        head(
            "POST http://wandb.corp:8080/files/e/p/r/file_stream?x=1 HTTP/1.1",
            "Host: wandb.corp:8080",
            f"Proxy-Authorization: {basic('relay', 'tok')}",
            "Proxy-Connection: keep-alive",
            "Connection: keep-alive, X-Hop",
            "X-Hop: 1",
            "Content-Length: 2",
            "Authorization: Basic a2V5",
        )
    )
    assert (h.target, h.tunnel, h.path) == (Endpoint("wandb.corp", 8080), False, "/files/e/p/r/file_stream?x=1")
    assert h.forwarded() == head(
        "POST /files/e/p/r/file_stream?x=1 HTTP/1.1",
        "Host: wandb.corp:8080",
        "Content-Length: 2",
        "Authorization: Basic a2V5",  # W&B's own key: the server's business, untouched
        "Connection: close",
    )
    assert parse_head(head("GET http://w.corp HTTP/1.1", "Host: w.corp")).target == Endpoint("w.corp", 80)
    assert parse_head(head("GET http://w.corp HTTP/1.1", "Host: w.corp")).path == "/"


def test_a_folded_header_line_is_joined_with_a_space() -> None:  # RFC 9112 5.2: a proxy may do so
    h = parse_head(head("CONNECT a:1 HTTP/1.1", "Host: a:1", "X: a", " folded"))
    assert h.header("x") == "a folded"


@pytest.mark.parametrize(
    ("raw", "refusal"),
    [
        (b"\r\n\r\n", Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1"), Refusal.BAD_REQUEST),  # HTTP/1.1 without Host (RFC 9112 3.2)
        (head("CONNECT api.wandb.ai HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),  # no port
        (head("CONNECT api.wandb.ai:0 HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),
        (head("CONNECT user@api.wandb.ai:443 HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),
        (head("GET https://api.wandb.ai/ HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),  # never the TLS client
        (head("GET /graphql HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),  # a server's request, not a proxy's
        (head("GET http://u:p@w.corp/ HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),
        (head("GET http://w.corp:99999/ HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),
        (head("GET http://w.corp/ HTTP/2.0", "Host: h"), Refusal.BAD_REQUEST),
        (head("GET  http://w.corp/ HTTP/1.1", "Host: h"), Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1", "Host: a:1", "Bad Header: x"), Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1", "Host: a:1", "Bad :x"), Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1", "Host: a:1", "no colon"), Refusal.BAD_REQUEST),
    ],
)
def test_a_head_the_relay_does_not_serve_is_refused(raw: bytes, refusal: Refusal) -> None:
    with pytest.raises(RefusalError) as e:
        parse_head(raw)
    assert e.value.refusal is refusal


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (basic("relay", "tok"), True),
        (basic("anyone", "tok"), True),
        ("basic " + base64.b64encode(b"relay:tok").decode(), True),
        (None, False),
        (basic("relay", "tok2"), False),
        (basic("relay", ""), False),
        (basic("tok", ""), False),
        ("Bearer tok", False),
        ("Basic !!!", False),
        ("Basic " + base64.b64encode(b"no-colon").decode(), False),
        ("Basic " + base64.b64encode(b"relay:\xff").decode(), False),
    ],
)
def test_only_the_run_s_token_is_answered(value: str | None, ok: bool) -> None:
    lines = ["CONNECT api.wandb.ai:443 HTTP/1.1", "Host: api.wandb.ai:443"]
    lines += [f"Proxy-Authorization: {value}"] if value else []
    assert authorized(parse_head(head(*lines)), "tok") is ok


def test_a_refusal_is_a_whole_answer_that_closes_the_connection() -> None:
    assert Refusal.NOT_ALLOWED.response() == b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    assert b"Proxy-Authenticate: Basic" in Refusal.AUTH.response()
