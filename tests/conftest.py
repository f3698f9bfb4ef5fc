"""Shared fixtures: the W&B test backend, the W&B environment, and local multi-node clusters.

Every test that touches W&B talks only to the backend on 127.0.0.1. Cluster tests share
one ``ray.cluster_utils.Cluster`` per module and give each run a unique name.
"""

from __future__ import annotations

import glob
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)
# Ray workers started by the clusters below import train loops from the test modules.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)

from wandb_backend import WandbTestBackend  # noqa: E402

# The Train controller takes one report per health-check interval (default 2 s).
os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
os.environ["RAY_DEDUP_LOGS"] = "0"
os.environ["NO_PROXY"] = "127.0.0.1,localhost"

DUMMY_KEY = "k" * 40
# Settings every test writer gets: samples and uploads often enough for short runs.
FAST = {"x_file_stream_transmit_interval": 1}


@pytest.fixture(scope="session")
def backend() -> Iterator[WandbTestBackend]:
    with WandbTestBackend() as b:
        yield b


@pytest.fixture(autouse=True)
def wandb_env(
    backend: WandbTestBackend, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's W&B environment, pointed at the test backend (captured by each callback)."""
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_BASE_URL", backend.base_url)
    monkeypatch.setenv("WANDB_API_KEY", DUMMY_KEY)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path_factory.mktemp("wandb")))


@contextmanager
def offline_backend(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, WandbTestBackend]]:
    """``WANDB_DIR`` in a folder of its own, and a backend of its own that must stay unused."""
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    with WandbTestBackend() as own_backend:
        monkeypatch.setenv("WANDB_BASE_URL", own_backend.base_url)
        yield wandb_dir, own_backend


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_cluster(*node_cpus: int, head_cpus: int = 0) -> Any:
    """A local cluster: a head (``head_cpus``) plus one node per entry of ``node_cpus``."""
    import ray
    from ray.cluster_utils import Cluster

    # Nodes start without any W&B setting, as on a real cluster: whatever reaches the
    # controller and the node loggers must come through the callback.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("WANDB_")}
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": head_cpus, "include_dashboard": False},
        )
        for cpus in node_cpus:
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
    finally:
        os.environ.update(saved)
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def stop_cluster(cluster: Any) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


def session_log_text(cluster: Any) -> str:
    """Everything the Ray processes of this cluster wrote to their log files."""
    logs = os.path.join(cluster.head_node.get_session_dir_path(), "logs")
    out = []
    for path in glob.glob(os.path.join(logs, "**", "*"), recursive=True):
        if os.path.isfile(path) and path.endswith((".err", ".out", ".log")):
            with open(path, errors="replace") as f:
                out.append(f.read())
    return "\n".join(out)


def plugin_leftovers() -> tuple[list[str], list[str]]:
    """(alive NodeLogger and LoggerJanitor actor ids, non-removed placement groups of the plugin)."""
    import ray._private.state as state
    from ray.util import placement_group_table

    actors = [
        actor_id
        for actor_id, a in state.actors().items()
        if a.get("ActorClassName", "").endswith(("NodeLogger", "LoggerJanitor")) and a.get("State") != "DEAD"
    ]
    groups = [
        pg["name"]
        for pg in placement_group_table().values()
        if pg["name"].startswith("ray_wandb_nodes") and pg["state"] != "REMOVED"
    ]
    return actors, groups


def node_logger_count() -> int:
    """How many NodeLogger actors this cluster ever created (dead or alive)."""
    import ray._private.state as state

    return sum(1 for a in state.actors().values() if a.get("ActorClassName", "").endswith("NodeLogger"))
