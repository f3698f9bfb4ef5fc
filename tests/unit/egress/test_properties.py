"""Properties of the relay's head parser and allow-list over any input (hypothesis): a refusal or
a well-formed answer, never an unhandled exception; and where the relay resolves and connects."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_wandb_nodes._egress import Endpoint, allow_list, parse_entry
from ray_wandb_nodes._egress.heads import HeadParser, RefusalError, parse_head, valid_name
from ray_wandb_nodes._egress.upstream import open_upstream

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALLOW = allow_list("https://api.wandb.ai", ["minio.corp:9000", "*.s3.corp.example", "[2001:db8::2]:443"])

# Heads made of the parts a request has, each drawn from bytes a co-tenant might send.
_piece = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"CONNECT", b"GET", b"POST", b"HTTP/1.1", b"HTTP/1.0", b"http://", b":", b"[", b"]", b"\xc2\xb2"]),
    st.text(alphabet="abcz09.-_:[]/?#@%\u00b2\u00e9 \t", max_size=30).map(lambda t: t.encode("utf-8")),
)
_line = st.lists(_piece, max_size=6).map(b"".join)
_request_line = st.tuples(
    st.sampled_from([b"CONNECT", b"GET", b"POST", b"HEAD"]), _line, st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"])
).map(lambda p: b" ".join(p))
_header = st.tuples(
    st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Proxy-Authorization", b"X"]),
    _line,
).map(lambda kv: kv[0] + b": " + kv[1])
_heads = st.builds(
    lambda first, headers, end: b"\r\n".join([first, *headers]) + end,
    _request_line,
    st.lists(_header, max_size=6),
    st.sampled_from([b"\r\n\r\n", b"\n\n", b"\r\n", b""]),
)

# Heads close to a real one (a name, a port, a Host), where a few parts go wrong.
_name = st.one_of(
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\.[a-z0-9]{1,8}){0,3}", fullmatch=True),
    st.sampled_from(["api.wandb.ai", "127.0.0.1", "[2001:db8::2]", "x.s3.corp.example", "a..b", "\u00e9.b"]),
    st.text(alphabet="ab.-_[]:%\u00b2", max_size=12),
)
_port = st.one_of(st.integers(min_value=0, max_value=70000).map(str), st.sampled_from(["", "\u00b2", "08", "+1"]))
_authority = st.builds(lambda h, p: f"{h}:{p}" if p else h, _name, _port)
_plausible = st.builds(
    lambda method, where, path, headers, body: (
        (
            f"{method} {where if method == 'CONNECT' else 'http://' + where + path} HTTP/1.1\r\nHost: {where}\r\n"
        ).encode()
        + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
        + b"\r\n"
        + body
    ),
    st.sampled_from(["CONNECT", "GET", "POST"]),
    _authority,
    st.sampled_from(["/", "/graphql?x=1", "", "?q", "#f", "/a b"]),
    st.lists(
        st.tuples(
            st.sampled_from([b"Content-Length", b"Transfer-Encoding", b"Connection", b"X"]),
            st.one_of(st.sampled_from([b"0", b"5", b"chunked", b"close, X", b"Content-Length"]), _line),
        ),
        max_size=3,
    ),
    st.binary(max_size=20),
)
_heads = st.one_of(_heads, _plausible)


def _well_formed(head: Any) -> None:
    assert head.target.port in range(1, 65536)
    host = head.target.host
    assert host and (valid_name(host) or ":" in host or host[0].isdigit())
    if not head.tunnel:
        assert head.path.startswith("/")
        head.forwarded()  # a request h11 writes without complaint


@SETTINGS
@given(st.one_of(st.binary(max_size=300), _heads))
def test_any_bytes_give_a_refusal_or_a_well_formed_head(raw: bytes) -> None:
    try:
        head = parse_head(raw)
    except RefusalError:
        return
    _well_formed(head)


@SETTINGS
@given(_heads, st.integers(min_value=1, max_value=50))
def test_a_head_read_in_pieces_is_read_as_a_whole_one(raw: bytes, size: int) -> None:
    parser, head, refused = HeadParser(), None, False
    try:
        for i in range(0, len(raw), size):
            head = parser.feed(raw[i : i + size])
            if head is not None:
                break
    except RefusalError:
        refused = True
    try:
        whole = parse_head(raw)
    except RefusalError:
        assert refused or head is None
        return
    assert head == whole


@SETTINGS
@given(st.text(max_size=80))
def test_any_entry_gives_an_endpoint_a_wildcard_or_a_clear_error(entry: str) -> None:
    try:
        parsed = parse_entry(entry)
    except ValueError as e:
        assert repr(entry) in str(e)  # the error names the value
        return
    if isinstance(parsed, Endpoint):
        assert 0 < parsed.port < 65536
    else:
        domain, port = parsed
        assert domain.startswith(".") and 0 < port < 65536


@SETTINGS
@given(st.text(max_size=80), st.integers(min_value=-5, max_value=70000))
def test_the_allow_list_answers_any_endpoint(host: str, port: int) -> None:
    target = Endpoint(host, port)
    assert isinstance(ALLOW.allows(target), bool)


def test_a_name_is_resolved_fully_qualified_and_a_metadata_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    async def getaddrinfo(self: Any, host: str, port: int, **kwargs: Any) -> list[Any]:
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    with pytest.raises(RefusalError) as e:
        asyncio.run(open_upstream(Endpoint("minio.corp", 9000), ALLOW, None, 5.0))
    assert e.value.refusal.status == 403 and asked == ["minio.corp."]


def test_storage_hosts_that_reach_any_bucket_are_named() -> None:
    assert allow_list(None).any_owner() == []
    wide = allow_list(None, ["*.s3.amazonaws.com", "s3.amazonaws.com", "*.b1.s3.amazonaws.com", "minio.corp:9000"])
    assert wide.any_owner() == ["*.s3.amazonaws.com:443", "s3.amazonaws.com:443"]
