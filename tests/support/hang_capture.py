"""Capture real hang evidence for the verdict's unit tests: runs the ranks of
``tests/support/hang_rank.py`` in a mode, asks them for evidence as the node's logger does, and
writes each rank's slot counts, faulthandler text and dump-thread JSON as they came.

    python -m tests.support.hang_capture MODE OUT.json [GIL_LIB]

``groups`` runs four ranks, rank 3 the stuck one; the other modes three, rank 2 stuck.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ray_wandb_nodes._hang.dumps import request_dumps
from ray_wandb_nodes._hang.evidence import EvidencePaths
from tests.e2e.test_hang_evidence import ranks, settled


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    lib = sys.argv[3] if len(sys.argv) > 3 else ""
    world, stuck = (4, 3) if mode == "groups" else (3, 2)
    captured = []
    with ranks(mode, lib, world, stuck) as directory:
        slots = settled(directory, world)
        request_dumps(slots, timeout_s=10)
        for slot in slots:
            paths = EvidencePaths.of(directory, slot.rank, slot.pid)
            python = json.loads(paths.python.read_text()) if paths.python.exists() else None
            captured.append(
                {
                    "rank": slot.rank,
                    "steps": slot.steps,
                    "reports": slot.reports,
                    "training_ident": slot.thread_ident,
                    "faulthandler": paths.stacks.read_text(),
                    "dump_thread": python,
                }
            )
    out.write_text(json.dumps({"mode": mode, "ranks": captured}, indent=1) + "\n")


if __name__ == "__main__":
    main()
