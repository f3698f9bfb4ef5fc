"""What the progress beacon costs a rank per optimizer step, side by side with an empty call.

    python -m bench.beacon_cost [--calls 20000] [--rounds 101] [--json bench/results/beacon_cost.json]

In one process, no Ray, no W&B: ``Beacon.step()``, ``Beacon.report()`` and ``Beacon.phase()`` on
a slot under the beacon root (``/dev/shm`` where it exists), an empty Python function, and a
torch ``optimizer.step()`` of a one-element SGD without and with the global step hook (what a
rank pays through torch; the three alternate round by round). Each figure is the median over
``--rounds`` rounds of ``--calls`` calls (a tenth of them for torch), in nanoseconds per call.
On a busy machine torch's step varies by microseconds from round to round: the beacon's own
figure is ``step_ns``, the torch rows say what a step costs around it.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._timing import ns_per_call
from ray_wandb_nodes._hang.beacon import Beacon, Phase, default_root, install_step_hook


def empty() -> None:
    """The floor: one Python call that does nothing."""


def torch_step_costs(torch: Any, beacon: Beacon, calls: int, rounds: int) -> dict[str, float]:
    """``optimizer.step()`` of a one-element SGD with no global hook, a no-op hook and the
    beacon's hook, in interleaved rounds (the machine's noise falls on all three alike)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    param = torch.nn.Parameter(torch.ones(1))
    param.grad = torch.ones(1)
    opt = torch.optim.SGD([param], lr=0.0)
    runs: dict[str, list[float]] = {"torch_step_ns": [], "torch_step_noop_hook_ns": [], "torch_step_beacon_hook_ns": []}

    def noop(*_args: Any) -> None:
        pass

    def timed(name: str) -> float:
        remove: Callable[[], None] | None = None
        if name == "torch_step_noop_hook_ns":
            remove = register_optimizer_step_post_hook(noop).remove
        elif name == "torch_step_beacon_hook_ns":
            remove = install_step_hook(beacon)
        try:
            return ns_per_call(opt.step, calls, 1)
        finally:
            if remove is not None:
                remove()

    names = list(runs)
    for round_ in range(rounds):
        # Alternate the order each round: what runs third in a round is not always the same.
        for name in names if round_ % 2 else reversed(names):
            runs[name].append(timed(name))
    return {name: statistics.median(values) for name, values in runs.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=default_root(), prefix="rwn-beacon-bench-") as directory:
        beacon = Beacon(Path(directory), 0)
        figures = {
            "empty_call_ns": ns_per_call(empty, args.calls, args.rounds),
            "step_ns": ns_per_call(beacon.step, args.calls, args.rounds),
            "report_ns": ns_per_call(beacon.report, args.calls, args.rounds),
            "phase_ns": ns_per_call(lambda: beacon.phase(Phase.RUNNING), args.calls, args.rounds),
        }
        torch: Any = None
        with contextlib.suppress(ImportError):
            import torch
        if torch is not None:
            figures.update(torch_step_costs(torch, beacon, max(1, args.calls // 10), args.rounds))
        beacon.close()
    figures["step_minus_empty_ns"] = figures["step_ns"] - figures["empty_call_ns"]
    if "torch_step_ns" in figures:
        figures["beacon_hook_minus_noop_hook_ns"] = (
            figures["torch_step_beacon_hook_ns"] - figures["torch_step_noop_hook_ns"]
        )
    for name, value in figures.items():
        print(f"{name:28s} {value:10.0f}")
    if args.json:
        from bench._harness import write_result

        write_result(args.json, dict(figures))
    return figures


if __name__ == "__main__":
    main()
