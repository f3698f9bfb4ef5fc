"""The clusters of the end-to-end tests, one fixture per topology.

A module names its topology once, ``TOPOLOGY = "two_nodes"``, and its tests take ``cluster``.
Modules of one topology run one after another (``tests/conftest.py``) and the shared topologies
start once for all of them (``tests.support.cluster.shared_cluster``: a module's leftovers start
it afresh). A topology that one module alone needs, with scripted GPUs that are that module's
data, is that module's own ``cluster`` fixture (``test_train_multinode``, ``test_tune_multinode``,
``test_gpu``).

Where the host matters (hostnames, ``/dev/shm``, routes, a whole machine lost), a module takes
``hosts`` instead: worker nodes as hosts of their own in Linux namespaces (``tests/support/hosts.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import SHARED, shared_cluster, start_cluster, stop_cluster
from tests.support.hosts import HostCluster, HostSpec, host_cluster, unsupported


@pytest.fixture(scope="module")
def two_nodes() -> Any:
    """A CPU-less head and two one-CPU nodes: two train workers, one a node (shared)."""
    return shared_cluster(*SHARED["two_nodes"])


@pytest.fixture(scope="module")
def three_nodes() -> Any:
    """A CPU-less head and three one-CPU nodes: two workers and a spare node (shared)."""
    return shared_cluster(*SHARED["three_nodes"])


@pytest.fixture(scope="module")
def nodes_of_two_and_one_cpus() -> Iterator[Any]:
    """A CPU-less head and nodes of two CPUs and one: three workers put two ranks on one node."""
    c = start_cluster(2, 1, head_cpus=0)
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def head_only() -> Iterator[Any]:
    """One node, the head, with two CPUs: a single-node job."""
    c = start_cluster(head_cpus=2)
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Any:
    """The cluster of the module's ``TOPOLOGY`` (one of the fixtures above)."""
    topology = getattr(request.module, "TOPOLOGY", None)
    if topology not in ("two_nodes", "three_nodes", "nodes_of_two_and_one_cpus", "head_only"):
        raise pytest.UsageError(
            f"{request.module.__name__}: TOPOLOGY = {topology!r}; set it to one of tests/e2e/conftest.py's "
            "topology fixtures (two_nodes, three_nodes, nodes_of_two_and_one_cpus, head_only)"
        )
    return request.getfixturevalue(topology)


@pytest.fixture(scope="module")
def hosts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    """Worker nodes as hosts of their own (``tests/support/hosts.py``), one cluster for the module:
    its ``HOSTS`` (``HostSpec``s; two one-CPU hosts without one) and ``HOST_SYSTEM_CONFIG`` (the
    head's Ray system config, if any). pytest's base temp is shared by every host (the runs'
    storage). Skipped, with the reason, where the machine cannot make them (not root, no ``ip``).

    The hosts reach W&B only at the cluster's own backend (``hosts.backend``, at
    ``hosts.wandb_address``), not at the session's on 127.0.0.1: a module that takes ``hosts``
    overrides ``backend`` to return ``hosts.backend``, so that the driver's W&B environment
    (``tests/conftest.py``'s ``wandb_env``) points there too."""
    reason = unsupported()
    if reason:
        pytest.skip(reason)
    specs = getattr(request.module, "HOSTS", (HostSpec("a", "rwn-host-a"), HostSpec("b", "rwn-host-b")))
    config = getattr(request.module, "HOST_SYSTEM_CONFIG", None)
    with host_cluster(specs, shared=[tmp_path_factory.getbasetemp()], system_config=config) as cluster:
        yield cluster
