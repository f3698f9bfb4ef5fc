"""An aborted Train run (Ctrl-C on the driver) ends its W&B run once, as failed.

Up to Ray 2.54 an abort fires no abort hook, only a controller state update to the aborted
state; from 2.55 ``before_controller_abort`` fires first and the state update after it. Either
way the run must end exactly once, node writers first, with a failed exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.support.cluster import node_labels, plugin_leftovers
from tests.support.runs import assert_one_writer_per_label, unique, user_rows
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = [pytest.mark.cluster, pytest.mark.smoke]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


# The cluster: tests/e2e/conftest.py's two_nodes fixture.
TOPOLOGY = "two_nodes"


def test_an_aborted_run_ends_once_as_failed_with_every_node(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("abort")
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.support.abort_driver", cluster.address, name, str(tmp_path / "storage")],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # Train workers take both worker nodes; the controller runs on the driver's node, which
        # the driver names once connected (on Ray 2.50 it may be any node of this shared IP).
        driver_node = tmp_path / "storage" / "driver-node"
        wait_until(driver_node.exists, 60, lambda: f"the driver to connect ({log.read_text()[-2000:]})")
        by_node = node_labels()
        labels = {by_node[n.node_id] for n in cluster.worker_nodes} | {by_node[driver_node.read_text()]}

        def running_on_every_node() -> bool:
            runs = [r for r in backend.runs.values() if r.display_name == name]
            return bool(runs) and len(user_rows(runs[0])) >= 2 and runs[0].labels == labels

        def state() -> str:
            runs = [r for r in backend.runs.values() if r.display_name == name]
            seen = (len(user_rows(runs[0])), sorted(runs[0].labels)) if runs else "no run"
            return f"seen: {seen}; expected labels {sorted(labels)}; driver: {log.read_text()[-2000:]}"

        wait_until(running_on_every_node, 120, lambda: f"the run to report from every node ({state()})")
        their_janitors = janitors_of_other_jobs()
        assert len(their_janitors) == 1, their_janitors  # the driver's job's one janitor
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    (run,) = [r for r in backend.runs.values() if r.display_name == name]
    # One end, from the primary, as failed; no node writer set the run's state.
    assert len(run.completes) == 1, (run.completes, log.read_text()[-3000:])
    assert run.completes[0].exit_code not in (0, None)
    assert run.labels == labels
    assert_one_writer_per_label(run)
    wait_until(
        lambda: plugin_leftovers() == ([], []),
        60,
        lambda: f"the plugin's actors and groups to go ({plugin_leftovers()})",
    )
    # The driver's job has ended, and with it its janitor: it reads the job table every
    # JOB_CHECK_S (10 s) while it watches nobody; 60 s is that many times over, for a loaded lane.
    wait_until(
        lambda: janitors_of_other_jobs() == [], 60, lambda: f"the job's janitor to end ({janitors_of_other_jobs()})"
    )


def janitors_of_other_jobs() -> list[str]:
    """The alive janitors of jobs other than this test's driver's (the driver subprocess's)."""
    import ray
    import ray._private.state as state

    job = ray.get_runtime_context().get_job_id()
    return [
        a["Name"]
        for a in state.actors().values()
        if a["ActorClassName"].endswith("LoggerJanitor") and a["JobID"] != job and a["State"] != "DEAD"
    ]
