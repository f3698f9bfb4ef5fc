"""Where the relay may tunnel to (the allow-list), and which proxy wandb's client would take."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._egress import Endpoint, allow_list, endpoint_of, parse_entry, proxy_for


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("https://api.wandb.ai", Endpoint("api.wandb.ai", 443)),
        ("http://wandb.corp:8080/", Endpoint("wandb.corp", 8080)),
        ("http://WANDB.Corp.", Endpoint("wandb.corp", 80)),
        ("https://[2001:db8::1]:8443", Endpoint("2001:db8::1", 8443)),
    ],
)
def test_a_url_s_requests_go_to_its_host_and_the_scheme_s_port(url: str, endpoint: Endpoint) -> None:
    assert endpoint_of(url) == endpoint


def test_a_url_without_an_http_scheme_or_a_host_is_refused() -> None:
    for url in ("ftp://a.b", "api.wandb.ai", "https://"):
        with pytest.raises(ValueError, match="http:// or https://"):
            endpoint_of(url)


def test_w_and_b_s_cloud_allows_its_api_and_its_storage_host_and_nothing_else() -> None:
    allow = allow_list(None)
    assert allow.describe() == ["api.wandb.ai:443", "storage.googleapis.com:443"]
    assert allow.allows(Endpoint("API.wandb.ai.", 443))
    assert not allow.allows(Endpoint("api.wandb.ai", 80))
    assert not allow.allows(Endpoint("evil.storage.googleapis.com", 443))
    assert not allow.allows(Endpoint("142.250.0.1", 443))  # an address is not the name that resolves to it


def test_a_self_managed_server_allows_its_own_host_and_the_hosts_the_user_lists() -> None:
    allow = allow_list("http://wandb.corp:8080", ["minio.corp:9000", "*.s3.amazonaws.com", "[2001:db8::2]:443"])
    assert allow.describe() == ["*.s3.amazonaws.com:443", "[2001:db8::2]:443", "minio.corp:9000", "wandb.corp:8080"]
    assert allow.allows(Endpoint("bucket.s3.amazonaws.com", 443))
    assert not allow.allows(Endpoint("s3.amazonaws.com", 443))  # a wildcard: subdomains only
    assert not allow.allows(Endpoint("bucket.s3.amazonaws.com", 80))
    assert not allow.allows(Endpoint("ams3.amazonaws.com.evil", 443))
    assert allow.allows(Endpoint("2001:DB8::2", 443))


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ("", "not a host"),
        ("https://x.y", "not a host"),
        ("user@x.y", "not a host"),
        ("x.y:0", "port must be 1-65535"),
        ("x.y:http", "port must be 1-65535"),
        ("*.com", "public suffix"),
        ("*.co.uk", "public suffix"),
        ("*.amazonaws.com", "whole domain amazonaws.com"),
        ("*.example.com", "whole domain example.com"),
        ("x.y:²", "port must be 1-65535"),
        ("a*.x.y", "not a host"),
        ("[::1", "closing"),
    ],
)
def test_an_entry_that_is_not_a_host_or_host_and_port_is_refused(entry: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_entry(entry)


def test_an_entry_without_a_port_allows_https_only() -> None:
    assert parse_entry("minio.corp") == Endpoint("minio.corp", 443)
    assert parse_entry("*.s3.corp.example") == (".s3.corp.example", 443)


RELAY = "http://relay:t@10.0.0.1:3128"
SITE = "http://proxy.site:3128"


@pytest.mark.parametrize(
    ("case", "url", "settings", "environ", "proxy"),
    [
        ("no proxy anywhere", "https://api.wandb.ai", {}, {}, None),
        ("the https_proxy setting", "https://api.wandb.ai", {"https_proxy": RELAY}, {"HTTPS_PROXY": SITE}, RELAY),
        ("the setting of the other scheme does not apply", "http://w.corp", {"https_proxy": RELAY}, {}, None),
        ("the setting, also for a loopback host", "http://127.0.0.1:8080", {"http_proxy": RELAY}, {}, RELAY),
        ("HTTPS_PROXY", "https://api.wandb.ai", {}, {"HTTPS_PROXY": SITE}, SITE),
        ("https_proxy in lower case", "https://api.wandb.ai", {}, {"https_proxy": SITE}, SITE),
        ("host:port reads as http://", "https://api.wandb.ai", {}, {"HTTPS_PROXY": "proxy.site:3128"}, SITE),
        ("HTTP_PROXY is not for https", "https://api.wandb.ai", {}, {"HTTP_PROXY": SITE}, None),
        ("never for localhost", "http://localhost:8080", {}, {"HTTP_PROXY": SITE}, None),
        ("never for a loopback address", "https://127.0.0.2", {}, {"HTTPS_PROXY": SITE}, None),
        ("HTTP_PROXY is ignored under CGI", "http://w.corp", {}, {"HTTP_PROXY": SITE, "REQUEST_METHOD": "GET"}, None),
        ("NO_PROXY *", "https://api.wandb.ai", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "*"}, None),
        ("NO_PROXY a domain", "https://api.wandb.ai", {}, {"HTTPS_PROXY": SITE, "no_proxy": "x, wandb.ai"}, None),
        ("NO_PROXY the host", "https://wandb.ai", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "wandb.ai"}, None),
        ("NO_PROXY .domain: subdomains", "https://wandb.ai", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": ".wandb.ai"}, SITE),
        ("NO_PROXY *.domain", "https://api.wandb.ai", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "*.wandb.ai"}, None),
        ("NO_PROXY another port", "https://api.wandb.ai", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "wandb.ai:80"}, SITE),
        ("NO_PROXY a CIDR", "https://10.1.2.3", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "10.0.0.0/8"}, None),
        ("NO_PROXY an address", "https://10.1.2.3", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "10.1.2.3"}, None),
        ("NO_PROXY not a suffix", "https://notwandb.ai", {}, {"HTTPS_PROXY": SITE, "NO_PROXY": "wandb.ai"}, SITE),
    ],
)
def test_the_proxy_a_writer_s_requests_take(
    case: str, url: str, settings: dict[str, Any], environ: dict[str, str], proxy: str | None
) -> None:
    assert proxy_for(url, settings, environ) == proxy, case
