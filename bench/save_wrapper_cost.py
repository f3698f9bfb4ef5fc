"""What the checkpointing phase's wrapper costs a save, side by side with the save unwrapped.

    python -m bench.save_wrapper_cost [--calls 2000] [--rounds 51] [--json bench/results/save_wrapper_cost.json]

``torch.save`` may be called often with small objects (a scalar's state, an RNG state, one
tensor), so its wrapper must cost little. In one process, no Ray, no W&B, for a function that
does nothing (the wrapper's own cost) and for ``torch.save`` of one small tensor into memory:

- ``bare``: the function as it is;
- ``not_armed``: wrapped (``_phases.checkpointing``), no rank armed (every process but a train
  worker with hang detection on): one call and a global's read more;
- ``armed``: wrapped, on an armed rank's training thread: the beacon's checkpointing phase
  entered and left (two stamps);
- ``nested``: wrapped, on an armed rank already in the checkpointing phase (``torch.save``
  inside a framework's save): nothing entered.

The four alternate round by round. Each figure is the median over ``--rounds`` rounds of the
mean nanoseconds per call of ``--calls`` calls.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._timing import ns_per_call
from ray_wandb_nodes._hang import Phase, arm_rank, disarm_rank, in_phase, train_starts
from ray_wandb_nodes._hang.beacon import default_root
from ray_wandb_nodes._worker import phases as _phases

KINDS = ("bare", "not_armed", "armed", "nested")


def costs(name: str, save: Callable[[], Any], calls: int, rounds: int, root: Path) -> dict[str, float]:
    """``save`` bare, then wrapped: not armed, armed, nested; interleaved round by round."""
    wrapped = _phases.checkpointing(save)
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}

    def timed(kind: str) -> float:
        if kind == "bare":
            return ns_per_call(save, calls)
        if kind == "not_armed":
            return ns_per_call(wrapped, calls)
        arm_rank("save-wrapper-bench", 0, root=root)
        train_starts()
        try:
            if kind == "armed":
                return ns_per_call(wrapped, calls)
            with in_phase(Phase.CHECKPOINTING):
                return ns_per_call(wrapped, calls)
        finally:
            disarm_rank()

    for round_ in range(rounds):
        for kind in KINDS if round_ % 2 else reversed(KINDS):
            runs[kind].append(timed(kind))
    return {f"{name}_{kind}_ns": statistics.median(values) for kind, values in runs.items()}


def nothing() -> None:
    """A save that does nothing: what is left is the wrapper's own cost."""


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=51)
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        os.environ.setdefault(name, "0")  # arming sets them where unset: leave this process's as they were
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=default_root(), prefix="rwn-save-bench-") as directory:
        root = Path(directory)
        figures.update(costs("noop", nothing, args.calls * 10, args.rounds, root))
        torch: Any = None
        with contextlib.suppress(ImportError):
            import torch
        if torch is not None:
            tensor = torch.zeros(4)

            def small_save() -> None:
                torch.save(tensor, io.BytesIO())

            figures.update(costs("torch_save", small_save, args.calls, args.rounds, root))
    for prefix in ("noop", "torch_save"):
        if f"{prefix}_bare_ns" in figures:
            bare = figures[f"{prefix}_bare_ns"]
            for kind in KINDS[1:]:
                figures[f"{prefix}_{kind}_minus_bare_ns"] = figures[f"{prefix}_{kind}_ns"] - bare
    for name, value in figures.items():
        print(f"{name:34s} {value:10.0f}")
    if args.json:
        from bench._harness import write_result

        write_result(args.json, dict(figures))
    return figures


if __name__ == "__main__":
    main()
