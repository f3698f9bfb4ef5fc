"""Local multi-node Ray clusters (``ray.cluster_utils.Cluster``) and what the tests read from them:
node labels, log files, and what the plugin left behind."""

from __future__ import annotations

import glob
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.nvml import Gpu, ScriptedGpus
from tests.support.wait import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_cluster(*node_cpus: int, head_cpus: int = 0, gpu_nodes: Sequence[tuple[int, ScriptedGpus]] = ()) -> Any:
    """A local cluster: a head (``head_cpus``, no GPU) plus one node per entry of ``node_cpus``,
    then one per entry of ``gpu_nodes`` (CPUs, scripted GPUs): Ray's ``num_gpus`` is the GPU
    count, and the node's raylet, so every process there, loads the scripted NVML. The driver
    connects to one cluster at a time: a shared cluster still up goes first."""
    import ray
    from ray.cluster_utils import Cluster

    stop_shared_cluster()
    # Nodes start without any W&B setting, as on a real cluster: whatever reaches the
    # controller and the node loggers must come through the callback.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("WANDB_")}
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": head_cpus, "include_dashboard": False},
        )
        # The driver joins while the head is the only raylet: every node here shares one IP, and
        # some Ray releases (2.50) attach a driver to any raylet of its IP. The driver's node is
        # where the Train controller and the Tune driver run, so the tests need it to be the head.
        ray.init(address=cluster.address, log_to_driver=False)
        for cpus in node_cpus:
            cluster.add_node(num_cpus=cpus)
        for cpus, gpus in gpu_nodes:
            node = cluster.add_node(num_cpus=cpus, num_gpus=len(gpus.gpus), env_vars=gpus.env())
            gpus.node_id = str(node.node_id)
        cluster.wait_for_nodes()
    finally:
        os.environ.update(saved)
    assert ray.get_runtime_context().get_node_id() == cluster.head_node.node_id
    return cluster


def start_gpu_cluster(
    folder: str | os.PathLike[str], *gpu_counts: int, cpus: int = 1
) -> tuple[Any, list[ScriptedGpus]]:
    """A GPU-less head and one node of ``cpus`` CPUs per entry of ``gpu_counts``, each with that
    many scripted GPUs (busy H100s until a test changes them); the scripted GPUs of each node,
    in that order, their ``node_id`` set."""
    nodes = [
        ScriptedGpus(Path(folder) / f"gpus-{i}.txt", [Gpu() for _ in range(count)], node=f"node{i}")
        for i, count in enumerate(gpu_counts)
    ]
    return start_cluster(head_cpus=0, gpu_nodes=[(cpus, gpus) for gpus in nodes]), nodes


def stop_cluster(cluster: Any) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


# The topologies that modules share (tests/e2e/conftest.py's fixtures of these names): the CPUs
# of the worker nodes; the head has none (the driver and the Train controller run there).
SHARED = {"two_nodes": (1, 1), "three_nodes": (1, 1, 1)}

# The cluster that the modules of one shared topology share: tests/conftest.py
# runs such modules one after another, after the unit tests, so that each topology starts once.
_shared: dict[str, Any] = {}


def shared_cluster(*node_cpus: int) -> Any:
    """A CPU-less head and one node per entry of ``node_cpus``, shared with the modules that ask
    for the same topology. A module leaves it as it found it (one that removes a node adds one
    back); where it did not (a failed test, or what Ray keeps of a killed controller), the nodes
    and their free CPUs are checked here and the cluster is started afresh, so that one module's
    leftovers do not fail the modules after it."""
    key = tuple(sorted((0, *node_cpus)))
    if _shared.get("key") == key and _as_found(key):
        return _shared["cluster"]
    stop_shared_cluster()
    cluster = start_cluster(*node_cpus, head_cpus=0)
    _shared.update(key=key, cluster=cluster)
    return cluster


def stop_shared_cluster() -> None:
    cluster = _shared.pop("cluster", None)
    _shared.pop("key", None)
    if cluster is not None:
        stop_cluster(cluster)


def _as_found(node_cpus: tuple[int, ...]) -> bool:
    """Whether the alive nodes have these CPUs (sorted, the head's 0 included), every one of
    them free, and none of the plugin's actors or placement groups is left: what a test released
    may take Ray a moment to free, so this waits up to 15 s."""
    import ray

    def as_found() -> bool:
        alive = tuple(sorted(int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"]))
        free = ray.available_resources().get("CPU", 0) == sum(node_cpus)
        return alive == node_cpus and free and plugin_leftovers() == ([], [])

    try:
        wait_until(as_found, 15, "the shared cluster as it was found", every_s=0.5)
    except AssertionError:
        return False  # no failure: the cluster is started afresh
    return True


def node_labels() -> dict[str, str]:
    """node id -> the label the plugin gives that node."""
    import ray

    from ray_wandb_nodes._wandb.naming import node_label

    return {n["NodeID"]: node_label(n["NodeManagerHostname"], n["NodeID"]) for n in ray.nodes() if n["Alive"]}


def session_log_text(cluster: Any) -> str:
    """Everything the Ray processes of this cluster wrote to their log files."""
    logs = os.path.join(cluster.head_node.get_session_dir_path(), "logs")
    out = []
    for path in glob.glob(os.path.join(logs, "**", "*"), recursive=True):
        if os.path.isfile(path) and path.endswith((".err", ".out", ".log")):
            with open(path, errors="replace") as f:
                out.append(f.read())
    return "\n".join(out)


def said_by_workers(cluster: Any, text: str) -> int:
    """How many times the cluster's worker processes wrote ``text`` to their stderr (Ray Train
    also copies a train worker's log records into a log file of its own, not counted)."""
    logs = os.path.join(cluster.head_node.get_session_dir_path(), "logs")
    count = 0
    for path in glob.glob(os.path.join(logs, "worker-*.err")):
        with open(path, errors="replace") as f:
            count += f.read().count(text)
    return count


def plugin_leftovers() -> tuple[list[str], list[str]]:
    """(alive NodeLogger and RelayActor actor ids, and the job's janitors that still watch an owner;
    non-removed placement groups of the plugin). A janitor lives as long as its job (one for every
    fit of it): it is left over only while it watches a controller that is gone or done."""
    import ray
    import ray._private.state as state
    from ray.util import placement_group_table

    from ray_wandb_nodes._fleet.actors import PG_NAME_PREFIX

    actors = []
    for actor_id, a in state.actors().items():
        kind = a.get("ActorClassName", "")
        if a.get("State") == "DEAD" or not kind.endswith(("NodeLogger", "LoggerJanitor", "RelayActor")):
            continue
        if kind.endswith("LoggerJanitor"):
            try:
                janitor = ray.get_actor(a["Name"], namespace=PG_NAME_PREFIX)
                watching = ray.get(janitor.watching.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayActorError):  # gone meanwhile (its job ended)
                watching = []
            if not watching:
                continue
            actor_id = f"{actor_id} watching {watching}"
        actors.append(actor_id)
    groups = [
        pg["name"]
        for pg in placement_group_table().values()
        if pg["name"].startswith("ray_wandb_nodes") and pg["state"] != "REMOVED"
    ]
    return actors, groups


def assert_nothing_left() -> None:
    """None of the plugin's actors or placement groups is left. A ceiling on an event: the fleet
    ends its loggers and removes their groups as the run ends, and Ray's GCS lists them dead and
    removed a second or two later; 30 s is that many times over, for a loaded lane (it waits only
    as long as they take)."""
    wait_until(lambda: plugin_leftovers() == ([], []), 30, lambda: f"the plugin to leave nothing {plugin_leftovers()}")


def node_logger_count() -> int:
    """How many NodeLogger actors this cluster ever created (dead or alive)."""
    import ray._private.state as state

    return sum(1 for a in state.actors().values() if a.get("ActorClassName", "").endswith("NodeLogger"))
