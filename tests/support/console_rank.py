"""A rank's process as Ray runs a worker, for the console tests: at start it points its file
descriptors 1 and 2 at ``<logs>/worker-<id>-01000000-<pid>.out`` and ``.err`` (as Ray's core
worker does), writes what a train function writes, waits for ``<go>`` to exist, then ends as
``END`` says:

- ``raise``: an uncaught ``ValueError("bad shard 17")``: its traceback on stderr, exit 1;
- ``kill``: a last line, then SIGKILL to itself (the OOM killer's way): nothing more written;
- ``ok``: a last line, exit 0;
- ``flood N``: N lines of 100 bytes on stdout as fast as it can, then exit 0.

    python -m tests.support.console_rank LOGS GO END [N]

What it writes before ``go``: a print as Ray Train 2.60 writes one (to both streams), a Python
logging warning (stderr), a progress bar redrawn with carriage returns (stderr), a line of its own
on stdout. The logs folder gets ``<pid>.started`` once the descriptors point at the files.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

# Ray's worker file name: worker-<worker id, 56 hex>-<job id, 8 hex>-<pid>.{out,err}
WORKER_ID = "e8662b947b5a0000246bc771ba56a406fb1bfe2e481f1177727dd2b5"


def worker_file(logs: Path, pid: int, suffix: str) -> Path:
    return logs / f"worker-{WORKER_ID}-01000000-{pid}.{suffix}"


def main() -> None:
    logs, go, end = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    pid = os.getpid()
    for fd, suffix in ((1, "out"), (2, "err")):
        target = os.open(worker_file(logs, pid, suffix), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered, as Ray sets up a worker
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    print(":job_id:01000000", flush=True)  # Ray's markers for its log monitor
    print(":actor_name:RayTrainWorker", flush=True)
    print(":job_id:01000000", file=sys.stderr, flush=True)
    (logs / f"{pid}.started").touch()
    print(f"hello from pid {pid}", flush=True)
    print(f"hello from pid {pid}", file=sys.stderr, flush=True)  # Ray Train 2.60's print: both streams
    logging.getLogger("user").warning("a warning from pid %d", pid)
    for percent in range(0, 101, 10):
        sys.stderr.write(f"\r{percent:3d}%|{'#' * (percent // 10):<10}|")
        sys.stderr.flush()
    sys.stderr.write("\n")
    print("stdout line of its own", flush=True)
    while not go.exists():
        time.sleep(0.01)
    if end == "raise":
        print("about to fail", flush=True)
        raise ValueError("bad shard 17")
    if end == "kill":
        print("the last line before SIGKILL", flush=True)
        os.kill(pid, signal.SIGKILL)
    if end == "flood":
        line = "x" * 99 + "\n"
        for i in range(int(sys.argv[4])):
            sys.stdout.write(f"{i:08d}{line[8:]}")
        sys.stdout.flush()
    print("the last line, exit 0", flush=True)


if __name__ == "__main__":
    main()
