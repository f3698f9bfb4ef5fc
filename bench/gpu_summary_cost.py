"""What per-GPU summaries cost on a node, and how late the integer GPU series arrive.

    python -m bench.gpu_summary_cost [--gpus 8] [--interval 1.0] [--seconds 60] [--json FILE]

One real wandb writer (offline, so no backend is needed) on ``--gpus`` GPUs of the scripted NVML
(``tests/support/nvml.py``: wandb's own monitor samples them), read as a node logger reads its
writer once a sampling interval, two ways side by side on the same writer:

- ``buffer only``: wandb's kept samples (``run._system_metrics``) summarised, what the node
  summaries cost before the GPU rules (floats only);
- ``with the log``: the same plus the new blocks of the writer's transaction log (the SM clock
  and ECC counts, ``_wandb_log.LogTail``), what ``SummaryReader.read`` does now.

Reported: CPU of the reading process per read and per minute (``time.process_time``), the
transaction-log blocks a minute, and each block's lateness: when it was read, less the time of
its newest sample (the integer series' delay on the way to the rules).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json")
    args = parser.parse_args()

    from tests.support.nvml import Gpu, ScriptedGpus

    folder = tempfile.mkdtemp(prefix="gpu_summary_cost_")
    gpus = ScriptedGpus(os.path.join(folder, "gpus.txt"), [Gpu() for _ in range(args.gpus)], node="bench")
    os.environ.update(gpus.env())  # wandb's monitor process inherits it
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    from ray_wandb_nodes._health import SummaryReader, summarize
    from ray_wandb_nodes._wandb.writers import BUFFER_SAMPLES

    run = wandb.init(
        mode="offline",
        dir=folder,
        project="bench",
        settings=wandb.Settings(x_stats_sampling_interval=args.interval, x_stats_buffer_size=BUFFER_SAMPLES),
    )
    reader = SummaryReader()
    cpu: dict[str, list[float]] = {"buffer only": [], "with the log": []}
    late: list[float] = []
    seen_t: set[float] = set()
    since: float | None = None
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            time.sleep(args.interval)
            t0 = time.process_time()
            fresh = summarize(run._system_metrics or {}, since)
            since = fresh.t if fresh else since
            t1 = time.process_time()
            summary = reader.read(run)
            t2 = time.process_time()
            cpu["buffer only"].append(t1 - t0)
            cpu["with the log"].append(t2 - t1)
            for batch in summary.gpu_ints if summary is not None else ():
                if batch.t not in seen_t:
                    seen_t.add(batch.t)
                    late.append(time.time() - batch.t)
    finally:
        run.finish()
    minutes = (time.monotonic() - started) / 60
    reads_per_minute = 60.0 / args.interval
    print(
        f"node-side cost of GPU summaries: {args.gpus} scripted GPUs, sampled every {args.interval:g} s, "
        f"{len(cpu['with the log'])} reads over {minutes * 60:.0f} s"
    )
    out: dict[str, Any] = {"gpus": args.gpus, "interval_s": args.interval, "reads": len(cpu["with the log"])}
    for name, values in cpu.items():
        per_read = statistics.mean(values) * 1e3
        print(f"  {name:<13} {per_read:.3f} ms CPU a read, {per_read * reads_per_minute:.1f} ms a minute")
        out[name] = {"ms_per_read": per_read, "ms_per_minute": per_read * reads_per_minute}
    blocks = len(late)
    if late:
        print(
            f"  transaction-log blocks: {blocks / minutes:.1f} a minute "
            f"(one per {args.seconds / max(blocks, 1):.1f} s); "
            f"the integer series reach the reader {statistics.median(late):.1f} s (median), "
            f"{max(late):.1f} s (max) after their newest sample"
        )
    out |= {"blocks_per_minute": blocks / minutes, "late_s": late}
    if args.json:
        from bench._harness import write_result

        write_result(args.json, {"bench": "gpu_summary_cost", **out})


if __name__ == "__main__":
    main()
