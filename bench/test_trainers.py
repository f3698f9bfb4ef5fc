"""What a short end-to-end test's fit costs with each trainer the suite uses, side by side.

    python -m bench.test_trainers [--rounds 3] [--json bench/results/test_trainers.json]

The tests' standard run (``tests.support.training.fit``: two workers, four reports, with
``WandbNodesCallback``) on a CPU-less head and two one-CPU worker nodes, once through a
``TorchTrainer`` and once through Train V2's ``DataParallelTrainer`` (which ``TorchTrainer``
extends), interleaved, ``--rounds`` times. The whole ``fit()`` is timed; the ratio is of medians.
It is why the suite keeps ``TorchTrainer`` for what torch is part of (the smoke set, GPUs, the
frameworks) and runs the rest on the base trainer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

from bench._harness import WORK_DIR, simulated_cluster, write_result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The workers import the train loop by module name (tests.support.training).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)

    from tests.support.training import fit, make_callback

    seconds: dict[str, list[float]] = {"TorchTrainer": [], "DataParallelTrainer": []}
    with simulated_cluster(2):
        for r in range(args.rounds):
            order = list(seconds) if r % 2 == 0 else list(reversed(seconds))
            for kind in order:
                started = time.monotonic()
                name = f"trainers-{uuid.uuid4().hex[:8]}"
                result = fit(name, make_callback(), os.path.join(WORK_DIR, "storage"), torch=kind == "TorchTrainer")
                if result.error is not None:
                    print(f"{kind} failed: {result.error}", file=sys.stderr)
                    return 1
                seconds[kind].append(time.monotonic() - started)
                print(f"round {r + 1}: {kind} {seconds[kind][-1]:.1f} s", flush=True)
    medians = {kind: statistics.median(s) for kind, s in seconds.items()}
    ratio = medians["DataParallelTrainer"] / medians["TorchTrainer"]
    for kind, s in seconds.items():
        print(f"{kind:<20} median {medians[kind]:5.1f} s   rounds {' '.join(f'{x:.1f}' for x in s)}")
    print(f"DataParallelTrainer / TorchTrainer: {ratio:.2f}")
    if args.json:
        write_result(args.json, {"seconds": seconds, "medians": medians, "ratio": ratio, "rounds": args.rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
