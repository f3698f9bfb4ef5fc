"""Bringing one node's offline run to the driver side: through Ray vs through the run's storage.

    python -m bench.offline_collect [--sizes-mib 16 64 256] [--rounds 3] [--json bench/results/offline_collect.json]

A simulated cluster (a CPU-less head, one one-CPU worker node). On the worker node a real
``NodeLogger`` actor and, where a node writer's offline run would be, a transaction log of
``--sizes-mib``: a real offline wandb run's log written at the start (rows of 20 metrics)
repeated to that size (``--content log``), or random bytes, the incompressible worst case
(``--content random``). Each round measures packing alone on the node, then runs the fleet's
own collection code (``OfflineCollection.collect``) once per route, the two in alternating order:
``ray`` (packed on the node, fetched through Ray in 4 MiB chunks) and ``storage`` (packed,
copied into a storage folder by the node, read and unpacked by the driver side, deleted).
Both unpack into the run's folder on the driver side and delete the node's copy. Beside it,
the same content compressed in memory at gzip levels 1 (what ``pack`` uses) and 6.

On this machine node, driver and storage share one disk and two cores, so the figures compare
the two code paths, not a network with a bucket: on a cluster the Ray route runs at the
network's speed between node and driver, the storage route at the storage's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import uuid
from typing import Any

from bench._harness import WORK_DIR, simulated_cluster, write_result


def make_node_run(run_id: str, label: str, size: int, pattern: bytes | None) -> None:
    """On the node: a node writer's offline folder holding ``size`` bytes of ``pattern``
    repeated (random bytes when None)."""
    from ray_wandb_nodes.offline.index import node_local_dir

    folder = os.path.join(node_local_dir(run_id, label), "wandb", f"offline-run-bench-{run_id}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"run-{run_id}.wandb"), "wb") as f:
        written = 0
        while written < size:
            block = os.urandom(1 << 20) if pattern is None else pattern
            block = block[: size - written]
            f.write(block)
            written += len(block)


def real_log(rows: int = 20_000) -> bytes:
    """The transaction log of a real offline wandb run: ``rows`` rows of 20 metrics."""
    import glob
    import math
    import tempfile

    import wandb

    with tempfile.TemporaryDirectory() as d:
        run = wandb.init(mode="offline", dir=d, settings=wandb.Settings(x_disable_stats=True))
        for i in range(rows):
            run.log({f"metric_{k}": math.sin(i * 0.001 * (k + 1)) + k for k in range(20)})
        run.finish()
        (path,) = glob.glob(os.path.join(d, "wandb", "offline-run-*", "*.wandb"))
        with open(path, "rb") as f:
            return f.read()


def gzip_levels(content: bytes) -> dict[str, dict[str, float]]:
    """In memory, on the driver: ratio and MiB/s of gzip (zlib) levels 1 and 6 on ``content``."""
    import zlib

    out = {}
    for level in (1, 6):
        started = time.perf_counter()
        packed = zlib.compress(content, level)
        seconds = time.perf_counter() - started
        out[str(level)] = {"ratio": len(content) / len(packed), "mib_per_s": len(content) / seconds / (1 << 20)}
    return out


def collect_once(
    collection: Any, logger: Any, route: str, size: int, storage_root: str, pattern: bytes | None
) -> dict[str, Any]:
    import ray

    from ray_wandb_nodes._fleet.node_offline import PackedRun
    from ray_wandb_nodes.offline.index import open_index
    from ray_wandb_nodes.offline.storage import Transfer, storage_spot

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    node = logger.node
    ray.get(
        ray.remote(make_node_run)
        .options(num_cpus=0, scheduling_strategy=affinity(node.node_id))
        .remote(run_id, node.label, size, pattern)
    )
    if route == "pack":  # packing alone, on the node: what both routes start with
        started = time.perf_counter()
        packed: PackedRun = ray.get(logger.actor.pack_offline.remote(run_id, node.label, None))
        seconds = time.perf_counter() - started
        ray.get(logger.actor.discard_offline.remote(run_id, node.label))
        return {"seconds": seconds, "archive_bytes": packed.size}
    folder = os.path.join(WORK_DIR, "offline_collect", run_id)
    index = open_index(folder, run_id=run_id, project=None, name=None, group=None)
    storage = None
    if route == "storage":
        experiment, why_not = storage_spot(Transfer.STORAGE, f"{storage_root}/bench", None)
        assert experiment is not None, why_not
        storage = experiment.for_run(run_id)
    from ray_wandb_nodes._fleet.collect import CollectJob
    from ray_wandb_nodes._wandb.writers import Role

    job = CollectJob(run_id=run_id, index=index, role=Role.NODE, storage=storage, deadline=time.monotonic() + 600)
    started = time.perf_counter()
    collection.collect(job, logger)
    seconds = time.perf_counter() - started
    (entry,) = [w for w in index.data["writers"] if w["label"] == node.label]
    assert entry["state"] == "collected" and entry["via"] == route, entry
    got = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(folder, "nodes")) for f in fs)
    assert got == size, (got, size)
    shutil.rmtree(folder)
    return {"seconds": seconds, "archive_bytes": entry["bytes"]}


def affinity(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--content", choices=("log", "random"), default="log")
    parser.add_argument("--json", default="bench/results/offline_collect.json")
    args = parser.parse_args()

    import ray

    from ray_wandb_nodes._fleet.collect import OfflineCollection
    from ray_wandb_nodes._fleet.node_logger import logger_class
    from ray_wandb_nodes._fleet.nodes import alive_nodes
    from ray_wandb_nodes._fleet.pool import LoggerHandle
    from ray_wandb_nodes._warn import Warner

    routes = ("pack", "ray", "storage")
    runs: dict[str, dict[str, list[float]]] = {str(s): {r: [] for r in routes} for s in args.sizes_mib}
    archive: dict[str, int] = {}
    pattern = real_log() if args.content == "log" else None
    sample = pattern * (64 * (1 << 20) // len(pattern) + 1) if pattern is not None else os.urandom(64 << 20)
    levels = gzip_levels(sample[: 64 << 20])
    with simulated_cluster(1):
        head = ray.get_runtime_context().get_node_id()
        (node,) = [n for node_id, n in alive_nodes(ray.nodes()).items() if node_id != head]
        actor = logger_class().options(num_cpus=0, scheduling_strategy=affinity(node.node_id)).remote()
        ray.get(actor.status.remote())
        logger = LoggerHandle(node=node, actor=actor, pg=None)
        collection = OfflineCollection(Warner())
        storage_root = os.path.join(WORK_DIR, "offline_collect_storage")
        for size_mib in args.sizes_mib:
            for r in range(args.rounds):
                for route in routes if r % 2 == 0 else (routes[0], *routes[:0:-1]):
                    m = collect_once(collection, logger, route, size_mib << 20, storage_root, pattern)
                    runs[str(size_mib)][route].append(m["seconds"])
                    archive[str(size_mib)] = m["archive_bytes"]
                    print(f"  {size_mib:>4} MiB round {r + 1} {route:<8} {m['seconds']:.2f} s", flush=True)
        ray.kill(actor)
        shutil.rmtree(storage_root, ignore_errors=True)

    print()
    print(
        f"{'node run':>9} {'archive':>9} {'pack alone':>11} {'through Ray':>12} {'through storage':>16} "
        f"{'storage/Ray':>12}"
    )
    result: dict[str, Any] = {"rounds": args.rounds, "content": args.content, "gzip_levels": levels, "sizes": {}}
    for size, by_route in runs.items():
        ray_s, storage_s = statistics.median(by_route["ray"]), statistics.median(by_route["storage"])
        pack_s = statistics.median(by_route["pack"])
        result["sizes"][size] = {
            "archive_bytes": archive[size],
            "pack_s": by_route["pack"],
            "ray_s": by_route["ray"],
            "storage_s": by_route["storage"],
            "ratio_storage_to_ray": storage_s / ray_s,
        }
        print(
            f"{size + ' MiB':>9} {archive[size] / (1 << 20):>7.0f} MiB {pack_s:>9.2f} s {ray_s:>10.2f} s "
            f"{storage_s:>14.2f} s "
            f"{storage_s / ray_s:>12.2f}"
        )
    print("(medians over the rounds; both routes include packing on the node, shown alone first)")
    one, six = levels["1"], levels["6"]
    print(
        f"gzip on 64 MiB of this content: level 1 {one['ratio']:.1f}x at {one['mib_per_s']:.0f} MiB/s, "
        f"level 6 {six['ratio']:.1f}x at {six['mib_per_s']:.0f} MiB/s ({one['mib_per_s'] / six['mib_per_s']:.1f}x "
        f"faster; its archive {six['ratio'] / one['ratio']:.2f}x level 6's)"
    )
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
