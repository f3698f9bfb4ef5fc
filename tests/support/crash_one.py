"""One process whose train function ends, as a Train worker's does: run by Ray Train's own
``ThreadRunner``, with the plugin's hook (``_ray.failures.hook_train_errors``) recording the rank
into ``DIR`` unless ``MODE`` says ``bare``. Prints what Ray kept of the error, as JSON.

- ``raise`` / ``bare``: the train function raises ``ValueError("bad shard 17")`` from a cause;
- ``kill``: the process SIGKILLs itself in its train function (no Python runs after).

    python -m tests.support.crash_one MODE DIR
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def open_shard(index: int) -> None:
    raise OSError(f"shard {index} is truncated")


def load_shard(index: int) -> None:
    try:
        open_shard(index)
    except OSError as e:
        raise ValueError(f"bad shard {index}") from e  # <load_shard>


def train_func(mode: str) -> None:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    load_shard(17)


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    from ray.train.v2._internal.execution.worker_group.thread_runner import ThreadRunner

    from ray_wandb_nodes._failure import RankRecorder
    from ray_wandb_nodes._ray.failures import hook_train_errors

    if mode != "bare":
        assert hook_train_errors(RankRecorder(directory, 3).raised)
    runner = ThreadRunner()
    runner.run(lambda: train_func(mode))
    while runner.is_running():
        time.sleep(0.01)
    error = runner.get_error()
    base = getattr(error, "_base_exc", None)
    print(json.dumps({"type": type(error).__name__, "base": type(base).__name__, "base_message": str(base),
                      "traceback": str(error)}))  # fmt: skip


if __name__ == "__main__":
    main()
