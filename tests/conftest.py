"""Fixtures and environment: the W&B test backend, the driver's W&B environment, and what the
Ray processes of the test clusters need.

Every test that touches W&B talks only to the backend on 127.0.0.1. ``tests/unit``: no Ray
cluster (pure logic, and the real wandb client against the backend); ``tests/e2e``: real Ray
clusters, one fixture per topology (``tests/e2e/conftest.py``), each run with a unique name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import clib
from tests.support.cluster import stop_shared_cluster
from tests.support.env import DUMMY_KEY
from tests.support.wandb_backend import WandbTestBackend

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ray workers of the test clusters import train loops by module name (``tests.support.training``,
# ``tests.e2e.test_faults``, ...): the clusters' processes inherit this environment.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
# Scripted tools the clusters' processes find on PATH: ``ncclras`` (Ray's NCCL hang detector, only
# where a test turns it on).
os.environ["PATH"] = os.pathsep.join((os.path.join(REPO_ROOT, "tests", "support", "bin"), os.environ["PATH"]))
# The Train controller takes one report per health-check interval (default 2 s).
os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
# Ray 2.60's preemption watcher (an actor a fit that polls the nodes' drain state; no test drains a
# node) off, as the controller reads it from the driver's environment: about 6 % of a fit's CPU
# on 2 cores. tests/e2e/test_train_multinode.py turns it back on, where every fit runs as a user's.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ["RAY_DEDUP_LOGS"] = "0"
os.environ["NO_PROXY"] = "127.0.0.1,localhost"


def topology(item: pytest.Item) -> Any:
    """The cluster topology of an end-to-end test: its module's ``TOPOLOGY`` (tests/e2e/conftest.py),
    else its module alone (a cluster of its own)."""
    return getattr(item.module, "TOPOLOGY", None) or item.module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The unit tests first, then the end-to-end (``cluster``) modules, those of one cluster
    topology one after another, the fault tests (``slow``: nodes removed, processes killed) last
    of them: each topology starts once, and no unit test runs beside a cluster."""
    groups: dict[Any, int] = {}

    def order(indexed: tuple[int, pytest.Item]) -> tuple[bool, int, bool, int]:
        index, item = indexed
        if item.get_closest_marker("cluster") is None:
            return (False, 0, False, index)
        group = groups.setdefault(topology(item), len(groups))
        return (True, group, item.get_closest_marker("slow") is not None, index)

    items[:] = [item for _, item in sorted(enumerate(items), key=order)]


@pytest.fixture(scope="session", autouse=True)
def _shared_cluster_stopped() -> Iterator[None]:
    yield
    stop_shared_cluster()


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


@pytest.fixture(scope="session")
def gil_lib() -> str:
    """The GIL holder (``tests/support/gil_holder.c``), built once; a test that needs it skips,
    saying why, where no C compiler builds it (``.ci/run`` requires one)."""
    return clib.gil_holder_or_skip()
