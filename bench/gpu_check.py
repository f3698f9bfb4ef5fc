"""The GPU proof: a node writer's ``gpu.*`` series reach the run, and the node table has GPU columns.

    python -m bench.gpu_check [--seconds 40] [--allow-no-gpu]

One machine with a GPU, under 5 minutes: a local Ray cluster of a CPU-less, GPU-less head (the
driver and the Train controller, the run's primary) and one worker node with the machine's
first GPU; a one-worker ``TorchTrainer`` with ``use_gpu=True`` multiplies matrices on that GPU
for ``--seconds`` while ``WandbNodesCallback`` logs to the W&B test backend on 127.0.0.1. It
prints what the backend received and exits non-zero unless:

- the worker node's writer sent ``gpu.0.gpu`` and ``gpu.0.memoryAllocated`` series under that
  node's label, with utilisation above 0 at least once;
- the run's last ``nodes`` table has that node with ``gpu_util_mean`` and ``gpu_mem`` set.

Needs the test environment (``pip install -e .[test]``) with a CUDA build of torch.
``--allow-no-gpu`` runs the same plumbing on a machine without one (CPU matmuls; the GPU
assertions are reported as skipped), to check the script itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

from bench._harness import test_backend
from tests.support.runs import gpu_checks


def gpu_loop(config: dict[str, Any]) -> None:
    import time

    import ray.train
    import torch

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    x = torch.randn(4096 if device.type == "cuda" else 256, 4096 if device.type == "cuda" else 256, device=device)
    until = time.monotonic() + config["seconds"]
    step = 0
    while time.monotonic() < until:
        for _ in range(20):
            x = torch.tanh(x @ x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        step += 1
        ray.train.report({"step": step, "device": device.type, "norm": float(x.norm())})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--allow-no-gpu", action="store_true")
    args = parser.parse_args()

    import ray
    import torch
    from ray.cluster_utils import Cluster
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_wandb_nodes import WandbNodesCallback
    from ray_wandb_nodes._wandb.naming import node_label

    has_gpu = torch.cuda.is_available()
    if not has_gpu and not args.allow_no_gpu:
        print("gpu_check: torch sees no CUDA device (pass --allow-no-gpu to check the plumbing only)")
        return 2
    started = time.monotonic()
    with test_backend() as backend:
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False}
        )
        try:
            ray.init(address=cluster.address, log_to_driver=False)
            worker = cluster.add_node(num_cpus=2, num_gpus=1)
            cluster.wait_for_nodes()
            label = next(
                node_label(n["NodeManagerHostname"], n["NodeID"]) for n in ray.nodes() if n["NodeID"] == worker.node_id
            )
            name = f"gpu-check-{int(time.time())}"
            trainer = TorchTrainer(
                gpu_loop,
                train_loop_config={"seconds": args.seconds},
                scaling_config=ScalingConfig(num_workers=1, use_gpu=has_gpu),
                run_config=RunConfig(
                    name=name,
                    storage_path=tempfile.mkdtemp(prefix="gpu_check_"),
                    callbacks=[
                        WandbNodesCallback(
                            project="gpu-check",
                            sampling_interval_s=1.0,
                            settings={"x_file_stream_transmit_interval": 1},
                        )
                    ],
                ),
            )
            result = trainer.fit()
        finally:
            ray.shutdown()
            cluster.shutdown()
        run = next(r for r in backend.runs.values() if r.display_name == name)
        return report(run, label, result, has_gpu, time.monotonic() - started)


def report(run: Any, label: str, result: Any, has_gpu: bool, seconds: float) -> int:
    series = run.system_metrics().get(label, {})
    gpu_keys = sorted(k for k in series if k.startswith("gpu."))
    tables = run.tables("nodes")
    row = next((r for r in tables[-1] if r["node"] == label), None) if tables else None
    util = series.get("gpu.0.gpu", [])
    print(f"gpu_check: fit {'ok' if result.error is None else repr(result.error)} in {seconds:.0f}s; run {run.run_id}")
    print(f"  labels in the run: {sorted(run.labels)}")
    print(f"  worker node {label}: {len(gpu_keys)} gpu.* series: {', '.join(gpu_keys[:12])}")
    if util:
        print(f"  gpu.0.gpu: {len(util)} samples, max {max(util):.0f}%, last {util[-1]:.0f}%")
    print(f"  node table row: {row}")
    # The same checks tests/e2e/test_gpu.py makes on the scripted NVML in CI.
    checks = {"fit succeeded": result.error is None, **gpu_checks(run, label)}
    failed = 0
    for what, ok in checks.items():
        gpu_part = "gpu" in what.lower()
        state = "ok" if ok else ("skipped (no GPU)" if gpu_part and not has_gpu else "FAILED")
        failed += state == "FAILED"
        print(f"  [{state}] {what}")
    print("gpu_check: PASSED" if not failed else f"gpu_check: {failed} check(s) FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
