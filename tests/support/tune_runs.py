"""Ray Tune experiments' runs as the test backend recorded them: a run a trial, grouped by the
experiment's name; and markers a trial can wait on until its node's writer has sampled into its run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.cluster import node_labels
from tests.support.wandb_backend import RunRecord, WandbTestBackend


def experiment_runs(backend: WandbTestBackend, name: str) -> dict[str, RunRecord]:
    return {r.run_id: r for r in backend.runs.values() if r.group == name}


@contextmanager
def sampled_markers(backend: WandbTestBackend, name: str, folder: Path) -> Iterator[str]:
    """A folder where a file named by a node's id appears once a run of experiment ``name`` holds
    a sample of that node: trials given it as ``sampled_dir`` wait for their node's writer. (A
    trial shorter than its writer's start-up may end without its node's series, a documented
    limit; the tests that wait so are about whose run each node's series land in, not how soon.) Also
    ``<node id>-<run id>`` once that run holds the node's samples, and ``alerted`` once a run of
    the experiment has a GPU-lost alert, ``hung`` once one has a hang alert."""
    folder.mkdir()
    labels = node_labels()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            with backend._lock:
                runs = {run_id: set(run.labels) for run_id, run in experiment_runs(backend, name).items()}
                alerts = [a for run in experiment_runs(backend, name).values() for a in run.alerts]
            for node_id, label in labels.items():
                for run_id in (r for r, seen in runs.items() if label in seen):
                    (folder / node_id).touch()
                    (folder / f"{node_id}-{run_id}").touch()
            if any(a["title"].startswith("GPU lost: ") for a in alerts):  # not the straggler rule's noise
                (folder / "alerted").touch()
            if any(a["title"].startswith("Hang: ") for a in alerts):
                (folder / "hung").touch()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield str(folder)
    finally:
        stop.set()
        thread.join()
