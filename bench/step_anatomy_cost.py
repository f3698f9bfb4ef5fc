"""What taking every step apart costs a rank, beyond the hang beacon, side by side with it off.

    python -m bench.step_anatomy_cost [--rounds 21] [--steps 300] [--json bench/results/step_anatomy_cost.json]

Two parts, no Ray, no W&B, CPU only:

1. **The hot path, per call** (one process, interleaved rounds, medians in ns): the anatomy's two
   optimizer hooks, called with the arguments torch passes (its region written every 32nd step,
   as on a rank); a timed ``next()`` against the same ``next()`` bare; the beacon's ``step()``
   beside them. ``per_step_ns``: the hooks and one timed ``next()``, what a step of one batch
   pays beyond the beacon (torch's loop over its global hooks adds one iteration each: under the
   noise of a one-element ``optimizer.step()`` on this machine, so not measured apart);
   ``per_step_over_beacon_step``: that against the beacon's own step, measured alike. The passes
   (``_worker.step_loops``): ``pass_ns`` a DDP pass's wrapper and span, ``root_pass_ns`` FSDP2's
   root hook, ``wait_ns`` a buffer sync or collective timed inside a span; and what a step pays
   per loop kind: ``per_step_ddp_loop_ns`` (a pass and a buffer sync), ``per_step_accumulate_ns``
   (4 micro-batches), ``per_step_fsdp2_ns`` (a root pass, ``wait_ns`` more a collective).
2. **A real DDP step** (two processes over gloo on this machine, a small MLP fed by a
   ``DataLoader``): every step timed, in rounds that rotate the anatomy on (armed, DDP's timers at
   its CPU rate and read) and off (not armed, the loader's ``next()`` as torch has it, DDP at its
   default rate 100), twice: ``off_again`` is ``off`` under another name, so that
   ``ddp_off_again_over_off`` says how far apart two set-ups alike land (the noise floor of
   ``ddp_on_over_off``). Each mode's median step over its rounds, and the median over its rounds
   of the training thread's CPU time a step (waits for the other rank left out: a steadier
   measure of what the rank itself spends). Apart from the rounds: what DDP's
   logger spends on a timed iteration in C++ (``ddp_timed_iteration_ns``, paid one step in
   ``ddp_cpu_rate``), and one read of DDP's timers (``ddp_read_ns``, one step in 128).
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

from bench._timing import ns_per_call
from ray_wandb_nodes._hang.beacon import Beacon, default_root
from ray_wandb_nodes._steps import CPU_RATE, RegionWriter, StepRecorder
from ray_wandb_nodes._steps.ddp import TORCH_DEFAULT_RATE
from ray_wandb_nodes._steps.recorder import READ_EVERY
from ray_wandb_nodes._worker.step_inputs import Current, timed_fetch
from ray_wandb_nodes._worker.step_loops import _RootPass, timed_pass, timed_wait

ACCUMULATE = 4  # micro-batches a step of the gradient-accumulation loop

MODES = ("off", "on", "off_again")  # off_again: the same as off, the noise between two rounds alike


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

    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.0)
    with tempfile.TemporaryDirectory(dir=default_root(), prefix="rwn-steps-bench-") as directory:
        beacon = Beacon(Path(directory), 0)
        recorder = StepRecorder(RegionWriter(bytearray(256)))  # its region written 1 step in 32
        current = Current()
        current.recorder = recorder
        items = itertools.repeat(1)

        def bare(_: Any) -> int:
            return next(items)

        timed = timed_fetch(current, bare)

        def hooks() -> None:  # what torch calls around one step, as it calls them
            recorder.optimizer_pre(opt, (), {})
            recorder.optimizer_post(opt, (), {})

        def call() -> None:
            return None

        passed = timed_pass(current, call, torch.is_grad_enabled)  # DDP's forward: opens a busy span
        waited = timed_wait(current, call)  # DDP's buffer sync, a collective, Work.wait

        def pass_then_fetch() -> None:  # a pass's span, closed by the next fetch (as in a loop)
            passed()
            timed(None)

        root = _RootPass(current, type("State", (), {"_is_root": True})(), torch.nn.Identity(), torch.is_grad_enabled)

        def root_then_fetch() -> None:  # FSDP2's root module: our pre-forward hook, then a fetch
            root.pre()
            timed(None)

        def wait_in_pass() -> None:  # a timed wait is timed inside a busy span only
            recorder.open = 1
            waited()
            recorder.open = -1

        def flag_bare() -> None:
            recorder.open = 1
            call()
            recorder.open = -1

        out = interleaved(
            {
                "empty_call_ns": lambda: ns_per_call(lambda: None, calls),
                "beacon_step_ns": lambda: ns_per_call(beacon.step, calls),
                "hooks_ns": lambda: ns_per_call(hooks, calls),
                "next_bare_ns": lambda: ns_per_call(lambda: bare(None), calls),
                "next_timed_ns": lambda: ns_per_call(lambda: timed(None), calls),
                "call_bare_ns": lambda: ns_per_call(call, calls),
                "call_then_fetch_ns": lambda: ns_per_call(lambda: (call(), timed(None)), calls),
                "pass_then_fetch_ns": lambda: ns_per_call(pass_then_fetch, calls),
                "root_then_fetch_ns": lambda: ns_per_call(root_then_fetch, calls),
                "flag_bare_ns": lambda: ns_per_call(flag_bare, calls),
                "wait_timed_ns": lambda: ns_per_call(wait_in_pass, calls),
            },
            rounds,
        )
        beacon.close()
    out["hooks_ns"] -= out["empty_call_ns"]  # the benchmark's own call around them
    out["next_ns"] = out["next_timed_ns"] - out["next_bare_ns"]
    out["per_step_ns"] = out["hooks_ns"] + out["next_ns"]
    # a pass: its wrapper and span (closed by the fetch after it), less the same call bare
    out["pass_ns"] = out["pass_then_fetch_ns"] - out["call_then_fetch_ns"]
    out["root_pass_ns"] = out["root_then_fetch_ns"] - out["call_then_fetch_ns"]  # FSDP2's root hook
    out["wait_ns"] = out["wait_timed_ns"] - out["flag_bare_ns"]
    # Per loop kind, what a step pays on the host beyond the beacon (the calls each step makes):
    # DDP: a pass and its buffer sync (a model with buffers); accumulating k micro-batches: k
    # batches, k passes, one buffer sync; FSDP2: the root's pass, and each collective it blocks
    # in (``wait_ns`` apiece: two or three a sharded module a step, each one a collective's cost).
    out["per_step_ddp_loop_ns"] = out["per_step_ns"] + out["pass_ns"] + out["wait_ns"]
    out["per_step_accumulate_ns"] = out["hooks_ns"] + ACCUMULATE * (out["next_ns"] + out["pass_ns"]) + out["wait_ns"]
    out["per_step_fsdp2_ns"] = out["per_step_ns"] + out["root_pass_ns"]
    # Both grow alike with the machine's load: the ratio carries over to a quiet machine.
    out["per_step_over_beacon_step"] = out["per_step_ns"] / (out["beacon_step_ns"] - out["empty_call_ns"])
    return out


# part 2: a real DDP step --------------------------------------------------------------------------
def rank_main(rank: int, store: str, rounds: int, steps: int, out: str) -> None:
    """One of the two ranks: the rounds in the order both ranks share, each round's mean step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from ray_wandb_nodes._worker.steps import arm_steps, disarm_steps

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
    torch_forward, torch_sync = DistributedDataParallel.forward, DistributedDataParallel._sync_buffers
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}  # the training thread's CPU time a step, a round
    ddp_reads: list[float] = []
    for round_ in range(rounds * len(MODES)):
        mode = MODES[(round_ + round_ // len(MODES)) % len(MODES)]  # a rotating order
        if mode == "on":
            recorder = arm_steps(bytearray(256))
            recorder.attach_ddp(ddp)  # made before arming: attached as the patch would
            recorder.attach_loop("cpu")
        else:
            _BaseDataLoaderIter.__next__ = torch_next  # type: ignore[method-assign]  # torch's own
            DistributedDataParallel.forward = torch_forward  # type: ignore[method-assign]
            DistributedDataParallel._sync_buffers = torch_sync  # type: ignore[method-assign]
            ddp._set_ddp_runtime_logging_sample_rate(100)  # DDP's default
        batches = iter(DataLoader(data, batch_size=4))
        dist.barrier()
        clock = time.perf_counter
        cpu_start = time.thread_time()
        for _ in range(steps):
            start = clock()
            (x,) = next(batches)
            ddp(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            times[mode].append(clock() - start)
        cpu[mode].append((time.thread_time() - cpu_start) / steps)
        if mode == "on":
            timers = recorder._ddp
            if timers is not None:
                ddp_reads.append(ns_per_call(timers.read, 200))
            disarm_steps()
    timed_iteration = logger_cost(ddp, torch)
    dist.destroy_process_group()
    result = {"times": times, "cpu": cpu, "ddp_read_ns": ddp_reads, "timed_iteration_ns": timed_iteration}
    Path(out).write_text(json.dumps(result))


def logger_cost(ddp: Any, torch: Any) -> float:
    """What DDP's logger does at the forward after a timed iteration (``set_runtime_stats_and_log``),
    less what it does after one it did not time: the C++ cost of one timed CPU iteration."""
    for _ in range(3):  # iterations with timer events to compute from, at rate 1
        ddp._set_ddp_runtime_logging_sample_rate(1)
        ddp(torch.ones(4, 256)).pow(2).mean().backward()
    timed = statistics.median(ns_per_call(ddp.logger.set_runtime_stats_and_log, 500) for _ in range(21))
    ddp._set_ddp_runtime_logging_sample_rate(10**9)
    for _ in range(12):  # past the first ten, which DDP always times
        ddp(torch.ones(4, 256)).pow(2).mean().backward()
    untimed = statistics.median(ns_per_call(ddp.logger.set_runtime_stats_and_log, 500) for _ in range(21))
    return timed - untimed


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
    cpu = {mode: statistics.median(result["cpu"][mode]) for mode in MODES}
    return {
        "ddp_thread_cpu_off_us": cpu["off"] * 1e6,
        "ddp_thread_cpu_on_us": cpu["on"] * 1e6,
        "ddp_thread_cpu_off_again_us": cpu["off_again"] * 1e6,
        "ddp_thread_cpu_on_minus_off_us": (cpu["on"] - cpu["off"]) * 1e6,
        "ddp_thread_cpu_off_again_minus_off_us": (cpu["off_again"] - cpu["off"]) * 1e6,
        "ddp_step_off_us": med["off"] * 1e6,
        "ddp_step_on_us": med["on"] * 1e6,
        "ddp_step_off_again_us": med["off_again"] * 1e6,
        "ddp_on_over_off": med["on"] / med["off"],
        "ddp_off_again_over_off": med["off_again"] / med["off"],  # the noise floor of the ratio
        "ddp_timed_iteration_ns": result["timed_iteration_ns"],
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
    # Under DDP, a step also pays the timed iterations DDP adds at the plugin's rate (beyond its
    # default one in 100) and a read of its timers one step in READ_EVERY.
    figures["per_step_ddp_ns"] = (
        figures["per_step_ns"]
        + figures["ddp_timed_iteration_ns"] * (1 / CPU_RATE - 1 / TORCH_DEFAULT_RATE)
        + figures["ddp_read_ns"] / READ_EVERY
    )
    for name, value in figures.items():
        print(f"{name:32s} {value:12.3f}")
    if args.json:
        from bench._harness import write_result

        write_result(args.json, dict(figures))
    return figures


if __name__ == "__main__":
    main()
