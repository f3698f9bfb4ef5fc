"""How the relay reads a client's request head, whom it answers, and what it sends on."""

from __future__ import annotations

import base64

import pytest

from ray_wandb_nodes._egress.allow import Endpoint
from ray_wandb_nodes._egress.heads import (
    Refusal,
    RefusalError,
    authorized,
    close_response_head,
    interim,
    parse_head,
)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def test_connect_names_its_host_and_port() -> None:
    h = parse_head(head("CONNECT api.wandb.ai:443 HTTP/1.1", "Host: api.wandb.ai:443", "User-Agent: Go"))
    assert (h.method, h.target, h.tunnel, h.path) == ("CONNECT", Endpoint("api.wandb.ai", 443), True, "")
    assert parse_head(head("CONNECT [2001:db8::1]:8443 HTTP/1.1")).target == Endpoint("2001:db8::1", 8443)


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
    assert parse_head(head("GET http://w.corp HTTP/1.1")).target == Endpoint("w.corp", 80)
    assert parse_head(head("GET http://w.corp HTTP/1.1")).path == "/"


@pytest.mark.parametrize(
    ("raw", "refusal"),
    [
        (b"\r\n\r\n", Refusal.BAD_REQUEST),
        (head("CONNECT api.wandb.ai HTTP/1.1"), Refusal.BAD_REQUEST),  # no port
        (head("CONNECT api.wandb.ai:0 HTTP/1.1"), Refusal.BAD_REQUEST),
        (head("CONNECT user@api.wandb.ai:443 HTTP/1.1"), Refusal.BAD_REQUEST),
        (head("GET https://api.wandb.ai/ HTTP/1.1"), Refusal.BAD_REQUEST),  # the relay is never the TLS client
        (head("GET /graphql HTTP/1.1"), Refusal.BAD_REQUEST),  # a server's request, not a proxy's
        (head("GET http://u:p@w.corp/ HTTP/1.1"), Refusal.BAD_REQUEST),
        (head("GET http://w.corp:99999/ HTTP/1.1"), Refusal.BAD_REQUEST),
        (head("GET http://w.corp/ HTTP/2.0"), Refusal.BAD_REQUEST),
        (head("GET  http://w.corp/ HTTP/1.1"), Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1", "Bad Header: x"), Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1", "X: a", " folded"), Refusal.BAD_REQUEST),
        (head("CONNECT a:1 HTTP/1.1", "no colon"), Refusal.BAD_REQUEST),
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
    lines = ["CONNECT api.wandb.ai:443 HTTP/1.1"] + ([f"Proxy-Authorization: {value}"] if value else [])
    assert authorized(parse_head(head(*lines)), "tok") is ok


def test_a_refusal_is_a_whole_answer_that_closes_the_connection() -> None:
    assert Refusal.NOT_ALLOWED.response() == b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    assert b"Proxy-Authenticate: Basic" in Refusal.AUTH.response()


def test_an_answer_s_head_says_the_connection_closes() -> None:
    raw = head("HTTP/1.1 200 OK", "Content-Length: 2", "connection: keep-alive")
    assert close_response_head(raw) == head("HTTP/1.1 200 OK", "Content-Length: 2", "Connection: close")
    assert interim(head("HTTP/1.1 100 Continue")) and not interim(raw)
