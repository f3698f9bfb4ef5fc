"""The relay with the real wandb client: a node with no route to W&B joins the run through it, as
plain HTTP (absolute form) and as HTTPS through CONNECT, and the relay never sees the plaintext.

The node is a network namespace of the test's own (``tests/support/netns.py``) whose way to the
W&B backend's address is prohibited; the primary writes from the machine, straight. Both writers
are processes made as the plugin makes them (``tests/support/egress_writer.py``). Between the node
and the relay a wiretap keeps every byte the relay receives and sends. No Ray here: what runs on
the node is the writer's process, its wandb-core, and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ray_wandb_nodes._egress import Reach, RelayConfig, RelayStats, RelayThread, allow_list, check_reach, new_token
from tests.support import netns, tls
from tests.support.env import DUMMY_KEY
from tests.support.netns import Netns, node_namespace
from tests.support.wait import wait_until
from tests.support.wandb_backend import RunRecord, WandbTestBackend
from tests.support.wiretap import Tapped, Wiretap

pytestmark = [
    pytest.mark.skipif(netns.unsupported() is not None, reason=str(netns.unsupported())),
    pytest.mark.skipif(tls.unsupported() is not None, reason=str(tls.unsupported())),
]
NODE_LABEL, PRIMARY_LABEL = "node-a", "node-head"
TLS_RECORD = b"\x16\x03"  # a TLS handshake record's first bytes


@pytest.fixture(scope="module")
def node() -> Iterator[Netns]:
    with node_namespace() as ns:
        ns.block(ns.wandb, "prohibit")  # the node's way to W&B is closed; to the head it is open
        yield ns


@pytest.fixture(scope="module")
def certificate(node: Netns, tmp_path_factory: pytest.TempPathFactory) -> tls.Certificate:
    return tls.make_certificate(Path(tmp_path_factory.mktemp("tls")), node.wandb)


@dataclass
class Written:
    run: RunRecord
    stats: RelayStats
    taps: list[Tapped]
    node_report: dict[str, object]
    direct: Reach  # the node's own check of the W&B host
    relayed: Reach  # the same check through the relay


def write_through_relay(node: Netns, backend: WandbTestBackend, folder: Path, ca: Path | None = None) -> Written:
    """The primary straight, the node writer through the relay (behind a wiretap); both finished.
    ``ca``: the authority of the backend's certificate, which the writers and the check trust."""
    run_id = f"egress-{backend.base_url.split(':')[0]}"
    token = new_token()
    relay = RelayThread(RelayConfig(allow_list(backend.base_url), token, node.head))
    relay.start()
    assert relay.address is not None
    tap = Wiretap(node.head, relay.address).start()
    procs: list[subprocess.Popen[str]] = []
    try:
        context = ssl.create_default_context(cafile=str(ca)) if ca else None
        proxy = f"http://relay:{token.reveal()}@{node.head}:{tap.port}"
        direct = node.call(lambda: check_reach(backend.base_url, context=context)).outcome
        relayed = node.call(lambda: check_reach(backend.base_url, proxy=proxy, context=context)).outcome
        writer_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
            "WANDB_BASE_URL": backend.base_url,
            "WANDB_API_KEY": DUMMY_KEY,
            "WANDB_PROJECT": "egress",
            "WANDB_DIR": str(folder),
            "WANDB_SILENT": "true",
            "WANDB_ERROR_REPORTING": "false",
            # Go's crypto/x509 (wandb-core) reads the test's authority here.
            **({"SSL_CERT_FILE": str(ca)} if ca else {}),
        }
        stop = folder / "stop"
        argv = [sys.executable, "-m", "tests.support.egress_writer"]
        primary = subprocess.Popen(
            [*argv, "primary", run_id, PRIMARY_LABEL, str(stop)], env=writer_env, stdout=subprocess.PIPE, text=True
        )
        procs.append(primary)
        assert primary.stdout is not None and json.loads(primary.stdout.readline())  # the run exists
        node_env = {**writer_env, "RWN_RELAY": f"{node.head}:{tap.port}", "RWN_RELAY_TOKEN": token.reveal()}
        writer = subprocess.Popen(
            node.command([*argv, "node", run_id, NODE_LABEL, str(stop)]),
            env=node_env,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(writer)
        assert writer.stdout is not None
        report = json.loads(writer.stdout.readline() or "{}")
        wait_until(lambda: NODE_LABEL in backend.run(run_id).labels, 60, "the node's samples in the run")
        stop.touch()
        assert [p.wait(120) for p in procs] == [0, 0]
        stats = relay.stop()
        return Written(backend.run(run_id), stats, tap.taps(), report, direct, relayed)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        tap.stop()
        relay.stop()


def test_a_node_without_a_route_joins_the_run_through_the_relay_over_plain_http(
    node: Netns, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ray_wandb_nodes._egress")
    with WandbTestBackend(host=node.wandb) as backend:
        written = write_through_relay(node, backend, tmp_path)
    assert (written.direct, written.relayed) == (Reach.UNREACHABLE, Reach.REACHABLE)
    run = written.run
    assert run.labels == {NODE_LABEL, PRIMARY_LABEL} and len(run.history) > 0
    assert run.exit_codes == [0]  # the primary's complete only: a node writer never finishes the run
    assert written.stats.forwarded > 0 and written.stats.tunnels == 0 and written.stats.refused == {}
    assert list(written.stats.hosts) == [backend.base_url.removeprefix("http://")]
    # The writer's process and its wandb-core hold no proxy variable; wandb's settings name the relay.
    assert written.node_report == {
        **written.node_report,
        "process_proxy_variables": [],
        "core_proxy_variables": [],
        "core_found": True,
        "process_settings_name_the_relay": True,
    }
    # Plain HTTP: the relay reads what it forwards (the control of the HTTPS test's claim).
    sent = b"".join(bytes(t.up) for t in written.taps)
    assert run.run_id.encode() in sent and b"file_stream" in sent
    relay_log = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("ray_wandb_nodes._egress"))
    assert "request to" in relay_log and run.run_id not in relay_log and "file_stream" not in relay_log


def test_a_node_without_a_route_joins_the_run_through_the_relay_over_https_and_the_relay_sees_no_plaintext(
    node: Netns, certificate: tls.Certificate, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ray_wandb_nodes._egress")
    with WandbTestBackend(host=node.wandb, tls=certificate.server_context()) as backend:
        written = write_through_relay(node, backend, tmp_path, certificate.ca)
    assert backend.base_url.startswith("https://")
    assert (written.direct, written.relayed) == (Reach.UNREACHABLE, Reach.REACHABLE)
    run = written.run
    assert run.labels == {NODE_LABEL, PRIMARY_LABEL} and run.exit_codes == [0]
    assert written.stats.tunnels > 0 and written.stats.forwarded == 0 and written.stats.refused == {}
    assert written.node_report["process_settings_name_the_relay"] is True
    # Every connection the relay served: a CONNECT head naming the backend, then TLS records only,
    # both ways; the run's id, its paths, its labels and the W&B key are nowhere in the bytes.
    endpoint = backend.base_url.removeprefix("https://")
    served = [t for t in written.taps if t.up.startswith(b"CONNECT ")]
    assert len(served) == written.stats.tunnels  # the check's tunnel among them
    for t in served:
        head, _, rest_up = bytes(t.up).partition(b"\r\n\r\n")
        assert head.startswith(f"CONNECT {endpoint} HTTP/1.1".encode())
        answer, _, rest_down = bytes(t.down).partition(b"\r\n\r\n")
        assert answer == b"HTTP/1.1 200 Connection Established"
        assert rest_up.startswith(TLS_RECORD) and rest_down.startswith(TLS_RECORD)
        for plain in (run.run_id.encode(), b"file_stream", b"graphql", NODE_LABEL.encode(), DUMMY_KEY.encode()):
            assert plain not in rest_up and plain not in rest_down
    relay_log = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("ray_wandb_nodes._egress"))
    assert f"tunnel to {endpoint}" in relay_log and run.run_id not in relay_log
