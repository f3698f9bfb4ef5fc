"""What a big checkpoint costs the Train controller's node: disk, and the delay of rank 0's rows.

    python -m bench.checkpoint_cost [--gb 1] [--files 8] [--json FILE]

The primary writer (the one on the controller's node, the real ``PrimaryWriter`` and the real
wandb client against the test backend on 127.0.0.1) logs a row every 0.1 s, as rank 0's
reports would arrive, while a checkpoint of ``--gb`` GB (``--files`` files, as a sharded
checkpoint is) is logged as an artifact the way a Train run logs one (``checkpoint_artifact``,
the folder Ray persisted). Reported:

- disk used on the controller's node by wandb for the checkpoint: the peak and the end of what
  grows under its data, cache and run folders (staging copies, its artifact cache), the
  checkpoint itself not counted;
- the delay of rank 0's rows logged meanwhile: from the report to the writer thread writing
  it (median and worst), and how long the artifact took to be built and uploaded.

For the figures before the change, run the same script in a worktree of the commit before it
(``git worktree add /tmp/before <commit>``; copy this file there; run it from there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from types import SimpleNamespace
from typing import Any

ROW_EVERY_S = 0.1


def folder_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def make_checkpoint(folder: str, gb: float, files: int) -> int:
    os.makedirs(folder, exist_ok=True)
    size = int(gb * (1 << 30)) // files
    block = os.urandom(1 << 20)
    for i in range(files):
        with open(os.path.join(folder, f"shard-{i:02d}.pt"), "wb") as f:
            for _ in range(size // len(block)):
                f.write(block[:-1] + bytes([i]))  # no two shards alike
    return folder_bytes(folder)


def measure(gb: float, files: int) -> dict[str, Any]:
    import pyarrow.fs as pafs

    from bench._harness import test_backend
    from bench.fleet_scale import Quiet
    from ray_wandb_nodes._config.options import build_options
    from ray_wandb_nodes._config.secrets import capture_env
    from ray_wandb_nodes._config.values import Mode
    from ray_wandb_nodes._run.primary import PrimaryWriter
    from ray_wandb_nodes._wandb.artifacts import checkpoint_artifact
    from ray_wandb_nodes._wandb.writers import primary_spec

    root = tempfile.mkdtemp(prefix="ray_wandb_nodes_ckpt_")
    controller = os.path.join(root, "controller")  # wandb's folders on the controller's node
    storage = os.path.join(root, "storage", "checkpoint_000000")  # where Ray persisted it
    for name in ("run", "data", "cache", "artifacts"):
        os.makedirs(os.path.join(controller, name))
    checkpoint_bytes = make_checkpoint(storage, gb, files)
    delays: list[tuple[float, float]] = []  # (when reported, delay)

    def rows(payload: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        delays.append((payload["sent"], time.monotonic() - payload["sent"]))
        return {"step": payload["step"]}, {}, []

    try:
        with test_backend(os.path.join(controller, "run")) as backend:
            os.environ.update(  # every wandb folder on the "controller's disk", to measure it
                WANDB_DATA_DIR=os.path.join(controller, "data"),
                WANDB_CACHE_DIR=os.path.join(controller, "cache"),
                WANDB_ARTIFACT_DIR=os.path.join(controller, "artifacts"),
            )
            options = build_options(project="checkpoint-cost", sampling_interval_s=15.0)
            spec = primary_spec(
                options, capture_env(os.environ), mode=Mode.ONLINE, run_id=f"ckpt-{int(time.time())}",
                label="node-head-0", display_name="checkpoint-cost", group=None, config={},
                default_dir=os.path.join(controller, "run"),
            )  # fmt: skip
            primary = PrimaryWriter(spec, warner=Quiet(), rows=rows)
            primary.start()
            deadline = time.monotonic() + 60
            while not primary.ready and time.monotonic() < deadline:
                time.sleep(0.05)
            base = folder_bytes(controller)
            peak = [0]
            stop = threading.Event()

            def watch_disk() -> None:
                while not stop.wait(0.1):
                    peak[0] = max(peak[0], folder_bytes(controller) - base)

            threading.Thread(target=watch_disk, daemon=True).start()
            step = 0

            def report() -> None:
                nonlocal step
                primary.log({"step": step, "sent": time.monotonic()})
                step += 1
                time.sleep(ROW_EVERY_S)

            for _ in range(10):  # a second of rows before the checkpoint
                report()
            checkpoint = SimpleNamespace(path=storage, filesystem=pafs.LocalFileSystem())
            logged_at = time.monotonic()
            primary.log_artifact(lambda w: checkpoint_artifact(w, name="checkpoint-cost", checkpoint=checkpoint))

            def uploaded() -> bool:
                return any(a.type == "model" and a.committed for a in list(backend.artifacts.values()))

            while not uploaded() and time.monotonic() - logged_at < 600:
                report()
            upload_s = time.monotonic() - logged_at
            for _ in range(10):  # and a second after it
                report()
            primary.request_finish(0)
            primary.wait_done(600)
            stop.set()
            end = folder_bytes(controller) - base
    finally:
        shutil.rmtree(root, ignore_errors=True)
    during = [d for sent, d in delays if sent >= logged_at and sent <= logged_at + upload_s]
    return {
        "checkpoint_mb": checkpoint_bytes / 1e6,
        "disk_peak_mb": peak[0] / 1e6,
        "disk_end_mb": end / 1e6,
        "rows_during": len(during),
        "row_delay_median_s": statistics.median(during) if during else None,
        "row_delay_max_s": max(during) if during else None,
        "artifact_uploaded_s": upload_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    r = measure(args.gb, args.files)
    print(f"checkpoint of {r['checkpoint_mb']:.0f} MB in {args.files} files, logged while rank 0 reports every 0.1 s")
    print(f"  controller-node disk used by wandb: peak {r['disk_peak_mb']:.0f} MB, end {r['disk_end_mb']:.0f} MB")
    print(
        f"  rank-0 rows reported meanwhile: {r['rows_during']}, delay median {r['row_delay_median_s']:.3f} s, "
        f"worst {r['row_delay_max_s']:.3f} s"
    )
    print(f"  artifact built and uploaded in {r['artifact_uploaded_s']:.1f} s")
    if args.json:
        from bench._harness import write_result

        write_result(args.json, {"bench": "checkpoint_cost", "gb": args.gb, "files": args.files, **r})


if __name__ == "__main__":
    main()
