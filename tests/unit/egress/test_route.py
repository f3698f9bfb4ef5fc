"""What a node writer gets to send through the relay: wandb's proxy settings for its process, never
a proxy variable that Ray's own processes read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ray_wandb_nodes._config.secrets import Secret
from ray_wandb_nodes._egress import (
    RAY_PROXY_VARIABLES,
    RelayRoute,
    new_token,
    proxy_for,
    ray_proxy_variables,
    writer_environment,
    writer_settings,
)
from tests.support.env import DUMMY_KEY

ROUTE = RelayRoute("10.0.0.1", 3128, Secret("tok-en_1"))


def test_the_proxy_url_carries_the_token_as_user_info_and_nothing_shows_it() -> None:
    assert ROUTE.proxy_url() == "http://relay:tok-en_1@10.0.0.1:3128"
    assert RelayRoute("fd00::1", 3128, Secret("t")).proxy_url() == "http://relay:t@[fd00::1]:3128"
    assert "tok-en_1" not in repr(ROUTE) and "tok-en_1" not in str(ROUTE)
    token = new_token().reveal()
    assert len(token) >= 43 and token.replace("-", "").replace("_", "").isalnum()  # URL-safe, 256 bits


def test_a_writer_gets_wandb_s_proxy_settings_and_no_variable_ray_reads() -> None:
    assert writer_settings(ROUTE) == {"https_proxy": ROUTE.proxy_url(), "http_proxy": ROUTE.proxy_url()}
    env = writer_environment(ROUTE)
    assert env == {"WANDB_HTTPS_PROXY": ROUTE.proxy_url(), "WANDB_HTTP_PROXY": ROUTE.proxy_url()}
    assert ray_proxy_variables(env) == {}
    assert ray_proxy_variables({"HTTPS_PROXY": "x", "grpc_proxy": "y", "NO_PROXY": "z"}) == {
        "HTTPS_PROXY": "x",
        "grpc_proxy": "y",
    }
    assert RAY_PROXY_VARIABLES == {"http_proxy", "https_proxy", "all_proxy", "grpc_proxy"}


def test_the_writer_s_check_takes_the_relay_as_its_requests_will() -> None:
    site = {"HTTPS_PROXY": "http://site:1", "HTTP_PROXY": "http://site:1"}
    for url in ("https://api.wandb.ai", "http://wandb.corp:8080", "http://127.0.0.1:8080"):
        assert proxy_for(url, writer_settings(ROUTE), site) == ROUTE.proxy_url()


_PROCESS = """
import json, os, sys, wandb
from ray_wandb_nodes._egress import ray_proxy_variables
if sys.argv[1] == "share":
    from ray_wandb_nodes._wandb.runs import share_host_with_process
    share_host_with_process(wandb, json.loads(sys.argv[2]))
s = wandb.setup().settings
print(json.dumps({"https": s.https_proxy, "http": s.http_proxy, "ray": sorted(ray_proxy_variables(os.environ))}))
"""


def in_fresh_process(how: str, environ: dict[str, str], settings: dict[str, str] | None = None) -> dict[str, object]:
    """What a fresh process's wandb and environment hold, given the relay ``how``: by its
    environment (``env``) or by ``share_host_with_process`` (``share``, as a node writer's init)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k.lower() not in RAY_PROXY_VARIABLES}
    env = {**base, "WANDB_MODE": "offline", **environ}  # offline: no service call
    argv = [sys.executable, "-c", _PROCESS, how, json.dumps(settings or {})]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_wandb_reads_the_relay_from_the_writer_s_environment_before_it_is_set_up() -> None:
    url = ROUTE.proxy_url()
    assert in_fresh_process("env", writer_environment(ROUTE)) == {"https": url, "http": url, "ray": []}


def test_a_writer_s_proxy_becomes_its_process_s_wandb_settings_without_a_proxy_variable() -> None:
    url = ROUTE.proxy_url()
    settings = {"base_url": "http://127.0.0.1:9", "api_key": DUMMY_KEY, **writer_settings(ROUTE)}
    assert in_fresh_process("share", {}, settings) == {"https": url, "http": url, "ray": []}
    # Without a proxy of its own a writer leaves the process's as they were.
    assert in_fresh_process("share", {}, {"base_url": "http://127.0.0.1:9"}) == {"https": None, "http": None, "ray": []}
