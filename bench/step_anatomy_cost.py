"""What taking every step apart costs a rank, beyond the hang beacon, side by side with it off.

    python -m bench.step_anatomy_cost [--rounds 21] [--steps 300] [--json bench/results/step_anatomy_cost.json]

Two parts, no Ray, no W&B, CPU only:

1. **The hot path, per call** (one process, interleaved rounds, medians in ns): torch's
   ``optimizer.step()`` of a one-element SGD with the beacon's post-hook only, and with the
   anatomy's two optimizer hooks, called as torch calls them (its region written every 32nd
   step, as on a rank); a timed ``next()`` against the same ``next()`` bare; torch's own cost of
   calling two more global hooks (``optimizer.step()`` of a one-element SGD with the beacon's hook,
   and with two no-op hooks beside it); the beacon's ``step()`` for scale. ``per_step_ns``: the
   hooks and one timed ``next()``, what a step of one batch pays beyond the beacon (torch's
   dispatch of the two hooks aside, given apart: it is under the noise of a step here).
2. **A real DDP step** (two processes over gloo on this machine, a small MLP fed by a
   ``DataLoader``): steps timed in rounds that alternate the anatomy on (armed, DDP's timers at
   its CPU rate and read) and off (not armed, the loader's ``next()`` as torch has it, DDP at its
   default rate), and off with DDP timing every iteration (rate 1: what one sampled iteration
   costs in C++). Each mode's median step over all its rounds, and the ratio on / off.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray_wandb_nodes._hang.beacon import Beacon, default_root, install_step_hook
from ray_wandb_nodes._steps import CPU_RATE, RegionWriter, StepRecorder
from ray_wandb_nodes._steps.inputs import Current, timed_fetch

MODES = ("off", "on", "off_rate1")


def ns_per_call(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each figure's median over ``rounds`` rounds, the order alternating round by round."""
    got: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for name in runs if round_ % 2 else reversed(list(runs)):
            got[name].append(runs[name]())
    return {name: statistics.median(values) for name, values in got.items()}


def hot_path(rounds: int, calls: int) -> dict[str, float]:
    """Part 1: the anatomy's calls on the training thread, beside the beacon's ``step()``."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    param = torch.nn.Parameter(torch.ones(1))
    param.grad = torch.ones(1)
    opt = torch.optim.SGD([param], lr=0.0)
    with tempfile.TemporaryDirectory(dir=default_root(), prefix="rwn-steps-bench-") as directory:
        beacon = Beacon(Path(directory), 0)
        recorder = StepRecorder(RegionWriter(bytearray(256)))  # its region written 1 step in 16
        current = Current()
        current.recorder = recorder
        items = itertools.repeat(1)

        def bare(_: Any) -> int:
            return next(items)

        timed = timed_fetch(current, bare)

        def hooks() -> None:  # what torch calls around one step, as it calls them
            recorder.optimizer_pre(opt, (), {})
            recorder.optimizer_post(opt, (), {})

        def noop(*_: Any) -> None:
            pass

        def torch_step(extra_hooks: bool) -> float:
            removers = [install_step_hook(beacon)]
            if extra_hooks:  # two more global hooks: torch's own cost of calling them
                removers += [
                    register_optimizer_step_pre_hook(noop).remove,
                    register_optimizer_step_post_hook(noop).remove,
                ]
            try:
                return ns_per_call(opt.step, calls // 10)
            finally:
                for remove in removers:
                    if remove is not None:
                        remove()

        out = interleaved(
            {
                "empty_call_ns": lambda: ns_per_call(lambda: None, calls),
                "beacon_step_ns": lambda: ns_per_call(beacon.step, calls),
                "hooks_ns": lambda: ns_per_call(hooks, calls),
                "next_bare_ns": lambda: ns_per_call(lambda: bare(None), calls),
                "next_timed_ns": lambda: ns_per_call(lambda: timed(None), calls),
                "torch_step_beacon_ns": lambda: torch_step(False),
                "torch_step_beacon_and_two_hooks_ns": lambda: torch_step(True),
            },
            rounds,
        )
        beacon.close()
    out["hooks_ns"] -= out["empty_call_ns"]  # the benchmark's own call around them
    out["next_ns"] = out["next_timed_ns"] - out["next_bare_ns"]
    out["torch_two_hooks_ns"] = out["torch_step_beacon_and_two_hooks_ns"] - out["torch_step_beacon_ns"]
    out["per_step_ns"] = out["hooks_ns"] + out["next_ns"]
    return out


# part 2: a real DDP step --------------------------------------------------------------------------
def rank_main(rank: int, store: str, rounds: int, steps: int, out: str) -> None:
    """One of the two ranks: the rounds in the order both ranks share, each round's mean step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from ray_wandb_nodes._steps import arm_steps, disarm_steps

    torch.set_num_threads(1)
    file_store = dist.FileStore(store, 2)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=file_store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    width = 256
    ddp = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.001)
    data = TensorDataset(torch.randn(steps * 4, width))
    torch_next = _BaseDataLoaderIter.__next__
    times: dict[str, list[float]] = {m: [] for m in MODES}
    ddp_reads: list[float] = []
    for round_ in range(rounds * len(MODES)):
        mode = MODES[(round_ + round_ // len(MODES)) % len(MODES)]  # a rotating order
        if mode == "on":
            recorder = arm_steps(bytearray(256))
            recorder.attach_ddp(ddp)  # made before arming: attached as the patch would
        else:
            _BaseDataLoaderIter.__next__ = torch_next  # type: ignore[method-assign]  # torch's own
            ddp._set_ddp_runtime_logging_sample_rate(1 if mode == "off_rate1" else 100)
        batches = iter(DataLoader(data, batch_size=4))
        dist.barrier()
        clock = time.perf_counter
        for _ in range(steps):
            start = clock()
            (x,) = next(batches)
            ddp(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            times[mode].append(clock() - start)
        if mode == "on":
            timers = recorder._ddp
            if timers is not None:
                ddp_reads.append(ns_per_call(timers.read, 200))
            disarm_steps()
    dist.destroy_process_group()
    Path(out).write_text(json.dumps({"times": times, "ddp_read_ns": ddp_reads}))


def ddp_steps(rounds: int, steps: int) -> dict[str, float]:
    """Part 2: two ranks over gloo; each mode's median step, from rank 0."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="rwn-steps-bench-") as directory:
        outs = [str(Path(directory) / f"rank-{r}.json") for r in (0, 1)]
        procs = []
        for r in (0, 1):
            cmd = [sys.executable, "-m", "bench.step_anatomy_cost", "--rank", str(r), "--out", outs[r]]
            cmd += ["--store", str(Path(directory) / "store"), "--rounds", str(rounds), "--steps", str(steps)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=repo))
        for proc in procs:
            if proc.wait(timeout=1800) != 0:
                raise SystemExit(f"a rank failed ({proc.returncode})")
        result = json.loads(Path(outs[0]).read_text())
    med = {mode: statistics.median(result["times"][mode]) for mode in MODES}
    return {
        "ddp_step_off_us": med["off"] * 1e6,
        "ddp_step_on_us": med["on"] * 1e6,
        "ddp_step_off_rate1_us": med["off_rate1"] * 1e6,
        "ddp_on_over_off": med["on"] / med["off"],
        "ddp_on_minus_off_us": (med["on"] - med["off"]) * 1e6,
        "ddp_sampled_iteration_us": (med["off_rate1"] - med["off"]) * 1e6 * 100 / 99,  # rate 1 against 1 in 100
        "ddp_read_ns": statistics.median(result["ddp_read_ns"]) if result["ddp_read_ns"] else float("nan"),
        "ddp_cpu_rate": float(CPU_RATE),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=300, help="DDP steps a round")
    parser.add_argument("--calls", type=int, default=20000, help="calls a round of the hot path")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        rank_main(args.rank, args.store, args.rounds, args.steps, args.out)
        return {}
    figures = hot_path(args.rounds, args.calls)
    figures.update(ddp_steps(max(3, args.rounds // 3), args.steps))
    for name, value in figures.items():
        print(f"{name:32s} {value:12.3f}")
    if args.json:
        from bench._harness import write_result

        write_result(args.json, dict(figures))
    return figures


if __name__ == "__main__":
    main()
