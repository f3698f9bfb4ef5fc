"""Real DataLoader failures as a rank's own record holds them (torch's texts, captured): a
``torch.utils.data.DataLoader`` with one worker process whose dataset raises, whose worker is
killed by SIGKILL (as the kernel's OOM killer kills it), or dies of SIGBUS (as a worker does that
runs out of ``/dev/shm``). Each failure is recorded as the plugin's hook records a train
function's exception (``_failure.record.record_of``); ``python -m tests.support.dataloader_capture
OUT.json`` writes them (``tests/support/crash_evidence/dataloader.json``) for the unit tests."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

MODES = ("raise", "kill", "bus")


class Samples:
    """A dataset of 64 samples whose 17th fails as ``mode`` says, in the worker process."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> Any:
        import torch

        if index == 17:
            if self.mode == "raise":
                raise ValueError(f"bad sample {index}")  # <bad_sample>
            os.kill(os.getpid(), signal.SIGKILL if self.mode == "kill" else signal.SIGBUS)
        return torch.zeros(2)


def train_loop(mode: str) -> None:
    import torch.utils.data

    loader = torch.utils.data.DataLoader(Samples(mode), batch_size=1, num_workers=1)
    for _batch in loader:  # <for_batch>
        pass


def capture(mode: str) -> dict[str, Any]:
    from ray_wandb_nodes._failure.record import record_of

    try:
        train_loop(mode)
    except Exception as e:  # noqa: BLE001 - the failure is what is captured
        record = json.loads(record_of(1, e).to_json())
        return {"mode": mode, "record": record}
    raise AssertionError(f"the DataLoader of mode {mode} did not fail")


def main(argv: list[str]) -> None:
    import torch

    out = Path(argv[0])
    data = {"torch": torch.__version__, "captures": [capture(mode) for mode in MODES]}
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
