"""A Tune driver of its own process: ``python -m tests.support.tune_driver ADDRESS NAME STORAGE
SAMPLED_DIR [OPTION=JSON ...]``. It runs one trial a CPU node of :func:`reporting_trial` with
the plugin's Tune callback (the tests' settings and the options given) and prints one JSON line a
trial: its node, its trial id and its error, if any. A process of its own so that its W&B client
starts with the environment the test gives it (a test authority's ``SSL_CERT_FILE``, say), which a
pytest process whose W&B service already runs cannot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def reporting_trial(config: dict[str, Any]) -> None:
    """Reports once its node's writer has sampled into its run (the marker the test writes in
    ``sampled_dir``: ``tests/support/tune_runs.py``), so that the node's series reached the run
    while the trial ran; else fails, naming the marker."""
    import ray
    from ray import tune

    from tests.support.wait import wait_until

    node_id = ray.get_runtime_context().get_node_id()
    sampled = Path(config["sampled_dir"], node_id)
    wait_until(sampled.exists, 120, f"{sampled} (this node's writer sampled into the trial's run)", every_s=0.1)
    for i in range(3):
        tune.report({"score": i, "node_id": node_id})


def main(address: str, name: str, storage: str, sampled_dir: str, *options: str) -> None:
    import ray
    from ray import tune

    from tests.support.training import make_tune_callback

    ray.init(address=address, log_to_driver=False)
    cpu_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
    kwargs = {k: json.loads(v) for k, v in (o.split("=", 1) for o in options)}
    results = tune.Tuner(
        reporting_trial,
        param_space={"x": tune.grid_search(list(range(len(cpu_nodes)))), "sampled_dir": sampled_dir},
        run_config=tune.RunConfig(name=name, storage_path=storage, callbacks=[make_tune_callback(**kwargs)]),
    ).fit()
    for result in results:
        metrics = result.metrics or {}
        line = {"node_id": metrics.get("node_id"), "trial_id": metrics.get("trial_id"), "error": repr(result.error)}
        print(json.dumps(line) if result.error else json.dumps({**line, "error": None}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
