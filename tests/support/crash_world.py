"""A world of failure-test ranks (``tests/support/crash_rank.py``, one process a rank), watched
from outside as a node's logger watches its ranks (``_failure.DeathWatch`` on their pids), until
every rank has ended; and the capture of what they left (``python -m tests.support.crash_world
MODE OUT.json``) for the unit tests of the first death."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ray_wandb_nodes._failure import DeathWatch, Gone, RankRecord, oom_kills, read_records

WORLD, BAD, AT = 4, 1, 3
TIMEOUT_S = {"raise": 4.0}  # gloo's timeout in ``raise``: the waiters give up this long after the raise
HOLD_S = 6.0  # the raiser of ``raise`` stays up past it, as a Ray actor stays up
LONG_S = 120.0  # gloo's timeout in the other modes: a peer's process ends first, however loaded the machine


@dataclass(frozen=True)
class World:
    """What the ranks of one run left: their records, their deaths as watched, their exits."""

    mode: str
    records: list[RankRecord]
    gone: list[Gone]
    exits: dict[int, int]  # rank -> return code (negative: the signal)
    oom_kills: int | None


def run_world(mode: str, directory: Path, timeout_s: float = 240.0) -> World:
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(WORLD):
        cmd = [sys.executable, "-m", "tests.support.crash_rank", str(rank), str(WORLD), str(directory / "store"),
               str(directory), mode, str(BAD), str(AT), str(TIMEOUT_S.get(mode, LONG_S)), str(HOLD_S)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    watch = DeathWatch()
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            watch.look((rank, p.pid) for rank, p in enumerate(procs))
            time.sleep(0.01)  # the node logger looks about once a second; finer here, for the windows
        watch.look((rank, p.pid) for rank, p in enumerate(procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(timeout=30)
    stderr = {rank: (p.stderr.read().decode(errors="replace") if p.stderr else "") for rank, p in enumerate(procs)}
    if any(p.returncode is None for p in procs) or not watch.gone():
        raise AssertionError(f"the ranks of {mode} did not all end: {stderr}")
    exits = {rank: int(p.returncode) for rank, p in enumerate(procs)}
    return World(mode, read_records(directory), watch.gone(), exits, oom_kills())


def main() -> None:
    from ray_wandb_nodes._hang import default_root

    mode, out = sys.argv[1], Path(sys.argv[2])
    directory = Path(tempfile.mkdtemp(dir=default_root(), prefix="rwn-crash-"))
    try:
        world = run_world(mode, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    records = [json.loads(r.to_json()) for r in world.records]
    data = {"mode": mode, "world": WORLD, "records": records, "gone": [asdict(g) for g in world.gone],
            "exits": world.exits, "oom_kills": world.oom_kills}  # fmt: skip
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
