"""One rank's input read through Ray Data's own iterators, in a process of its own with a local
Ray (for ``tests/unit/steps/test_ray_data.py``): the step anatomy armed as a Train worker arms it,
then ``STEPS`` steps over ``DataIterator.iter_torch_batches`` (a dataset's ``iterator()``, the
class ``ray.train.get_dataset_shard`` returns a subclass of) and ``Dataset.iter_batches``, each
batch's collation sleeping ``COLLATE_S``. Prints the totals after each: ``{"torch": [...],
"plain": [...]}`` (``StepTotals`` as lists)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

STEPS, BATCH, COLLATE_S = 6, 4, 0.05


def main() -> None:
    from ray_wandb_nodes._worker.steps import arm_steps

    recorder = arm_steps(None)  # before Ray Data and torch are imported, as on a Train worker
    import ray
    import torch

    # a cluster of its own: never one another test (or CI's other slot) has running on this machine
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        out: dict[str, Any] = {}

        def collate(batch: dict[str, Any]) -> Any:
            time.sleep(COLLATE_S)  # the rank's own input work, on its iterator's way
            return torch.as_tensor(batch["id"], dtype=torch.float32)

        data = ray.data.range(STEPS * BATCH)
        optimizer.step()  # the first step's end: the loop starts here
        for batch in data.iterator().iter_torch_batches(batch_size=BATCH, collate_fn=collate):
            model(batch.reshape(-1, 1)).sum().backward()
            optimizer.step()
        out["torch"] = list(dataclasses.astuple(recorder.publish()))
        for _batch in data.iter_batches(batch_size=BATCH):
            time.sleep(COLLATE_S)  # the loop's own work, not input
            optimizer.step()
        out["plain"] = list(dataclasses.astuple(recorder.publish()))
        print(json.dumps(out))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
