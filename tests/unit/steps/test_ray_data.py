"""Ray Data's own iterators timed as a rank's input, on a real local Ray (a process of its own:
``tests/support/ray_data_rank.py``): ``DataIterator.iter_torch_batches`` (the class of what
``ray.train.get_dataset_shard`` returns) and ``Dataset.iter_batches`` (which on Ray 2.60 goes round
the iterator's public methods) each count every batch, the wait for one as input, and the loop's
own work between batches as none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_wandb_nodes._steps import Sources, StepTotals
from tests.support.ray_data_rank import COLLATE_S, STEPS

REPO = Path(__file__).resolve().parents[3]


def test_ray_data_s_iterators_time_every_batch_as_input_and_the_loop_s_own_work_as_none() -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.ray_data_rank"], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    torch_batches, plain = (StepTotals(Sources(t[0]), *t[1:]) for t in (out["torch"], out["plain"]))
    assert torch_batches.intervals == STEPS and torch_batches.batches == STEPS
    # every batch's collation (the first's also the pipeline's start) waited for in next(): the loop
    # between two batches is a tiny model's step, which a prefetched collation could overlap at most
    assert torch_batches.input_ns >= STEPS * COLLATE_S * 0.8 * 1e9
    assert plain.batches - torch_batches.batches == STEPS
    # each of those steps sleeps COLLATE_S itself after its batch: none of that is input (the input
    # counted there is the fetches, the first of them the second execution's start)
    steps, waited = plain.step_ns - torch_batches.step_ns, plain.input_ns - torch_batches.input_ns
    assert steps - waited >= STEPS * COLLATE_S * 1e9
