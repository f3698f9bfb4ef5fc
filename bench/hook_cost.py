"""What one report costs the process that hands it to W&B: the plugin's report hook on the
Train controller, next to ``run.log`` of the same dict, and Ray's ``WandbLoggerCallback``
handling the same result in Tune.

    python -m bench.hook_cost [--calls 2000] [--keys 20 200 2000] [--json bench/results/hook_cost.json]

All three run in this one process against the W&B test backend on 127.0.0.1, one after
another for each dict size, each with its writer running in the background as it would:

- ``WandbNodesCallback.after_report``: the hook Ray Train's controller calls on each report,
  with a live primary writer thread (shared mode) consuming its queue.
- ``run.log``: a ``wandb.init`` run in this process (what a rank-0 ``wandb.init`` in the train
  loop does on every step).
- ``WandbLoggerCallback.log_trial_result``: Ray's Tune callback, with its logging actor
  started (it cleans the result, then puts it on a Ray queue actor).

Each call is timed with ``perf_counter_ns``; the first 5 % are warm-up and left out.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from bench._harness import test_backend, write_result


def metrics(n: int, step: int) -> dict[str, Any]:
    """``n`` keys as a training loop reports them: floats in a few groups, some ints."""
    out: dict[str, Any] = {f"group{i % 10}/metric_{i}": step * 0.001 + i for i in range(n - 2)}
    out.update(step=step, epoch=step // 100)
    return out


def timed(call: Callable[[dict[str, Any]], Any], n: int, calls: int) -> list[float]:
    """Microseconds per call, warm-up left out."""
    payloads = [metrics(n, s) for s in range(calls)]
    out = []
    for payload in payloads:
        t0 = time.perf_counter_ns()
        call(payload)
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out[len(out) // 20 :]


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def plugin_hook(n: int, calls: int) -> list[float]:
    from ray_wandb_nodes import WandbNodesCallback

    cb = WandbNodesCallback(project="bench", sampling_interval_s=15.0)
    name = f"hook-{uuid.uuid4().hex[:6]}"
    ctx = SimpleNamespace(
        run_config=SimpleNamespace(name=name, storage_path=tempfile.gettempdir(), checkpoint_config=None),
        train_loop_config={"lr": 0.1},
        scaling_config=SimpleNamespace(num_workers=2, use_gpu=False),
    )
    cb.after_controller_start(ctx)
    primary = cb._run.sessions[cb._run.base_id].primary
    deadline = time.monotonic() + 60
    while not primary.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    assert primary.ready, "the primary writer did not start"
    try:
        # Train hands the hook one dict per rank; two ranks here.
        return timed(lambda m: cb.after_report(None, [m, m]), n, calls)
    finally:
        cb.after_controller_finish(SimpleNamespace(error=None))


def wandb_run_log(n: int, calls: int) -> list[float]:
    import wandb

    run = wandb.init(project="bench", id=f"log-{uuid.uuid4().hex[:6]}", reinit="create_new")
    try:
        return timed(run.log, n, calls)
    finally:
        run.finish()


class _Trial:
    """What WandbLoggerCallback reads of a Tune trial."""

    def __init__(self) -> None:
        self.trial_id = uuid.uuid4().hex[:8]
        self.config: dict[str, Any] = {"lr": 0.1}
        self.experiment_dir_name = "bench"
        self.local_path = tempfile.mkdtemp()

    def __str__(self) -> str:
        return f"trial_{self.trial_id}"


def ray_wandb_logger_callback(n: int, calls: int) -> list[float]:
    from ray.air.integrations.wandb import WandbLoggerCallback

    cb = WandbLoggerCallback(project="bench")
    cb.setup()
    trial = _Trial()
    cb.log_trial_start(trial)
    try:
        counter = iter(range(calls))
        return timed(lambda m: cb.log_trial_result(next(counter), trial, m), n, calls)
    finally:
        cb.log_trial_end(trial)
        cb.on_experiment_end([trial])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--keys", type=int, nargs="+", default=[20, 200, 2000])
    parser.add_argument("--json", default="bench/results/hook_cost.json")
    args = parser.parse_args()

    import ray

    stack = contextlib.ExitStack()
    stack.enter_context(test_backend(tempfile.mkdtemp(prefix="bench-wandb-")))
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    contenders = {
        "WandbNodesCallback.after_report": plugin_hook,
        "wandb run.log": wandb_run_log,
        "Ray WandbLoggerCallback.log_trial_result": ray_wandb_logger_callback,
    }
    rows = []
    try:
        for n in args.keys:
            for name, fn in contenders.items():
                us = fn(n, args.calls)
                rows.append(
                    {
                        "what": name,
                        "keys": n,
                        "calls": len(us),
                        "p50_us": percentile(us, 50),
                        "p99_us": percentile(us, 99),
                        "mean_us": statistics.mean(us),
                        "max_us": max(us),
                    }
                )
                r = rows[-1]
                print(
                    f"  measured {name} with {n} keys: p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us", flush=True
                )
    finally:
        ray.shutdown()
        stack.close()

    print()
    print(f"{'hook / call':<42} {'keys':>5} {'p50 us':>9} {'p99 us':>9} {'p99 / plugin p99':>17}")
    for n in args.keys:
        plugin = next(r for r in rows if r["keys"] == n and r["what"].startswith("WandbNodes"))
        for r in (r for r in rows if r["keys"] == n):
            ratio = r["p99_us"] / plugin["p99_us"]
            print(f"{r['what']:<42} {n:>5} {r['p50_us']:>9.1f} {r['p99_us']:>9.1f} {ratio:>16.1f}x")
    result = {
        "rows": rows,
        "calls_per_case": args.calls,
        "target": "plugin hook p99 < 100 us",
    }
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
