"""How much of a node's shared memory (``/dev/shm``) a run's hang folders take, with real armed ranks
after 2,000 collectives an attempt and three restarts.

    python -m bench.shm_footprint [--world 4] [--steps 2004] [--restarts 3] [--json FILE]

Each attempt starts ``--world`` processes of ``tests/support/hang_rank.py`` (torch.distributed over
gloo on this machine, one all_reduce a step, armed as a Train worker is: beacon, faulthandler on a
signal, the dump thread, the flight recorder with the plugin's ring of 2,000 entries a group);
rank 2 stops before step ``--steps`` in a Python loop, the others wait in its all_reduce (at 2,004
steps every ring is full). Once they settle, the node asks every rank's evidence three times the
dump thread's way and three times faulthandler's way (the rank's FIFO moved aside, as for a rank
whose Python cannot run), as a node logger does on three hangs. Then the attempt restarts as Ray
restarts a worker group: its processes killed, new ones started.

The node's side is what the installed package's node logger does: with ``_hang/folders.py`` (this
package), the fleet's watch of each attempt's folder (a new folder an attempt, the last one let go
at the restart, the files of dead processes removed as the node reads the slots); without it (an
earlier package, run from its tree), the run's one folder. Reported: ``du -sk`` of the run's
folders on the node, once the last attempt's evidence is taken (its ranks alive), the files there,
and the largest file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ray_wandb_nodes._hang import read_slots, request_dumps
from tests.support.hang_world import settled

REPO = Path(__file__).resolve().parents[1]
STUCK = 2

try:  # this package: a folder an attempt, watched as a node logger watches it
    from ray_wandb_nodes._hang import NodeWatch, attempt_key, run_dir

    ATTEMPTS = True
except ImportError:  # an earlier package: the run's one folder
    from ray_wandb_nodes._hang import run_dir  # type: ignore[no-redef]

    ATTEMPTS = False


def start_ranks(folder: Path, store: Path, world: int, steps: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000"}
    procs = []
    for rank in range(world):
        args = [str(rank), str(world), str(store), str(folder), "python", str(STUCK), str(steps)]
        cmd = [sys.executable, "-m", "tests.support.hang_rank", *args]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def evidence_rounds(folder: Path, rounds: int = 3) -> None:
    """What a node does on ``rounds`` hangs: every rank's dumps, the dump thread's way, then with
    the FIFOs moved aside (faulthandler's signal, as for ranks whose Python cannot run)."""
    for _ in range(rounds):
        request_dumps(read_slots(folder), timeout_s=30.0, grace_s=10.0)
    fifos = sorted(folder.glob("rank-*.req"))
    for fifo in fifos:
        fifo.rename(fifo.with_suffix(".aside"))
    try:
        for _ in range(rounds):
            request_dumps(read_slots(folder), timeout_s=10.0, grace_s=0.0)
    finally:
        for fifo in fifos:
            fifo.with_suffix(".aside").rename(fifo)


def du_kib(paths: list[Path]) -> int:
    there = [str(p) for p in paths if p.exists()]
    if not there:
        return 0
    out = subprocess.run(["du", "-skc", *there], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def measure(world: int, steps: int, restarts: int) -> dict[str, Any]:
    run_id = f"bench-shm-{uuid.uuid4().hex[:8]}"
    token = uuid.uuid4().hex[:8]
    stores = Path(tempfile.mkdtemp(prefix="shm-footprint-"))
    watch = NodeWatch() if ATTEMPTS else None
    folders: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        for attempt in range(1, restarts + 2):
            key = attempt_key(run_id, attempt, token) if ATTEMPTS else run_id
            folder = run_dir(key)
            if folder not in folders:
                folders.append(folder)
            if watch is not None:
                if attempt > 1:
                    watch.unwatch(attempt_key(run_id, attempt - 1, token))  # the restart: the fleet lets it go
                watch.watch(key, tuple(range(world)))
            procs = start_ranks(folder, stores / f"store-{attempt}", world, steps)
            settled(folder, world, steps, quiet_s=1.0, timeout_s=600.0)
            evidence_rounds(folder)
            if watch is not None:
                watch.progress()  # a ping: the node reads the slots
            if attempt <= restarts:
                for proc in procs:
                    proc.kill()
                for proc in procs:
                    proc.wait(timeout=30)
                if watch is not None:
                    watch.progress()
        files = sorted((p for f in folders if f.exists() for p in f.iterdir()), key=lambda p: p.stat().st_size)
        return {
            "package": "attempt folders" if ATTEMPTS else "one run folder",
            "world": world,
            "collectives_an_attempt": steps,
            "restarts": restarts,
            "folders": sum(f.exists() for f in folders),
            "du_kib": du_kib(folders),
            "files": len(files),
            "largest": f"{files[-1].name} {files[-1].stat().st_size} B" if files else "",
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(stores, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2004)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    out = measure(args.world, args.steps, args.restarts)
    for name, value in out.items():
        print(f"{name:<24} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
