"""Faults end to end: nodes that die or join, logger processes killed, a failing backend,
a dead controller. Training must never die or hang because of logging, every reported
metric must arrive once, and the run must end in the right state.

A CPU-less head and two one-CPU worker nodes; tests that remove a node add one back.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from functools import partial
from typing import Any

import pytest

from tests.support.cluster import (
    assert_nothing_left,
    free_port,
    node_labels,
    plugin_leftovers,
    session_log_text,
)
from tests.support.env import FAST, WANDB_SAMPLES_AT_JOIN, WANDB_TABLES
from tests.support.runs import assert_one_writer_per_label, failure_alerts, run_of, unique, user_rows
from tests.support.training import make_callback as callback_with_test_settings
from tests.support.training import trainer
from tests.support.wait import wait_until
from tests.support.wandb_backend import RunRecord, WandbTestBackend

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


# The cluster: tests/e2e/conftest.py's two_nodes fixture.
TOPOLOGY = "two_nodes"


def slow_loop(config: dict[str, Any]) -> None:
    """Reports every ``sleep`` seconds, rank 0 checkpoints, resumes from its checkpoint. With a
    ``stop`` folder, the ranks end together, before ``steps``, once the test has asked for it
    there: rank 0 answers the request before a report with that report's step, the last; every
    rank has seen the answer once that report returns (it waits for rank 0), and one that sees
    it sooner goes on to that step."""
    import os
    import tempfile
    import time

    import ray.train

    rank = ray.train.get_context().get_world_rank()
    if config.get("entries"):  # when this worker entered the train function, and where
        entered = f"{ray.get_runtime_context().get_node_id()}-{rank}-{time.time()!r}"
        open(os.path.join(config["entries"], entered), "w").close()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read())
    stop = config.get("stop")
    for step in range(start, config["steps"]):
        time.sleep(config["sleep"])
        if stop and rank == 0 and os.path.exists(os.path.join(stop, "requested")):
            if not os.path.exists(os.path.join(stop, "last")):
                with open(os.path.join(stop, "last.tmp"), "w") as f:
                    f.write(str(step))
                os.replace(os.path.join(stop, "last.tmp"), os.path.join(stop, "last"))
        metrics = {"step": step, "rank": rank}
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step + 1))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)
        if stop and os.path.exists(os.path.join(stop, "last")):
            with open(os.path.join(stop, "last")) as f:
                if step >= int(f.read()):
                    break
    if config.get("entries") and rank == 0:  # when training ended
        open(os.path.join(config["entries"], f"done-{time.time()!r}"), "w").close()


make_callback = partial(callback_with_test_settings, project="faults")


class Fit(threading.Thread):
    """``trainer.fit()`` in a thread: ``Cluster.add_node`` must run on the main thread."""

    def __init__(
        self,
        name: str,
        callback: Any,
        storage: str,
        *,
        steps: int,
        sleep: float,
        entries: str = "",
        torch: bool = False,
        stoppable: bool = False,
        **run_config: Any,
    ) -> None:
        super().__init__(daemon=True)
        self.name, self.callback, self.storage = name, callback, storage
        self.loop_config: dict[str, Any] = {"steps": steps, "sleep": sleep, "entries": entries}
        if stoppable:  # see slow_loop; ``steps`` stays the bound
            self.loop_config["stop"] = tempfile.mkdtemp(prefix="stop-", dir=storage)
        self.run_config = run_config
        self.torch = torch  # see tests.support.training.trainer
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        from ray.train import RunConfig, ScalingConfig

        started = time.monotonic()
        try:
            self.result = trainer(
                slow_loop,
                torch=self.torch,
                train_loop_config=self.loop_config,
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(
                    name=self.name,
                    storage_path=self.storage,
                    callbacks=[self.callback] if self.callback is not None else [],
                    **self.run_config,
                ),
            ).fit()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            self.error = e
        self.seconds = time.monotonic() - started

    def stop(self) -> None:
        """Ask a ``stoppable`` fit's ranks to end after their next report."""
        open(os.path.join(self.loop_config["stop"], "requested"), "w").close()

    def training_error(self) -> BaseException | None:
        if self.is_alive():
            return AssertionError("fit() has not returned")
        return self.error or (self.result.error if self.result is not None else None)


def rows_of(backend: WandbTestBackend, name: str) -> int:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return len(runs[0].history) if runs else 0


def first_event_time(run: RunRecord, label: str) -> float | None:
    times = [row["_timestamp"] for row in run.events if any(k.endswith(f"/l:{label}") for k in row)]
    return min(times) if times else None


def label_clients(run: RunRecord, label: str) -> set[str]:
    return {c for c, labels in run.labels_by_client().items() if label in labels}


def plugin_groups(state: str) -> list[str]:
    """Names of the plugin's placement groups in ``state``."""
    from ray.util import placement_group_table

    return [
        g["name"]
        for g in placement_group_table().values()
        if g["name"].startswith("ray_wandb_nodes") and g["state"] == state
    ]


def worker_node_of(cluster: Any, node_id: str) -> Any:
    return next(n for n in cluster.worker_nodes if n.node_id == node_id)


def alive_logger_pids() -> dict[str, int]:
    import ray._private.state as state

    return {
        a["Address"]["NodeID"]: a["Pid"]
        for a in state.actors().values()
        if a.get("ActorClassName", "").endswith("NodeLogger") and a.get("State") == "ALIVE"
    }


# The drained and the killed node on every lane of the Ray range (smoke): the killed one is the way
# a node goes that held Ray 2.50's restarted workers back (a placement group left rescheduling for
# it); the drained one goes through Ray's graceful removal, whose path differs by release.
@pytest.mark.smoke
@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "killed"])
def test_node_dies_and_a_replacement_joins_the_same_run(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any, graceful: bool
) -> None:
    from ray.train import FailureConfig

    name = unique("node-dies")
    # Two retries: a restart placed on the node just removed is lost once more at times (below).
    failure = FailureConfig(max_failures=2)
    entries = tmp_path / "entries"
    entries.mkdir()
    fit = Fit(
        name,
        make_callback(),
        str(tmp_path),
        steps=11,
        sleep=0.6,
        entries=str(entries),
        torch=True,
        failure_config=failure,
    )
    fit.start()
    wait_until(lambda: rows_of(backend, name) >= 3, 90, "three reports")
    run = run_of(backend, name)
    victim_id = next(nid for nid in alive_logger_pids())  # a worker node with a node writer
    victim_label = node_labels()[victim_id]
    cluster.remove_node(worker_node_of(cluster, victim_id), allow_graceful=graceful)
    removed_at = time.time()
    new_node = cluster.add_node(num_cpus=1)
    added_at = time.time()
    # The lost node's placement group goes with it: one left rescheduling holds back every group
    # created after it on Ray 2.50, the restarted train workers' included.
    wait_until(lambda: not plugin_groups("RESCHEDULING"), 30, "the lost node's placement group to go")
    fit.join(300)
    assert not fit.is_alive()
    assert fit.training_error() is None

    new_label = node_labels()[new_node.node_id]
    assert new_label in run.labels
    joined = first_event_time(run, new_label)
    assert joined is not None
    # The replacement's writer joined as part of the restart: the workers the restart placed on
    # the new node entered the train function after its first sample (wandb 0.31 samples as a
    # writer joins; 0.28 and 0.29 one sampling interval later, 0.5 s here, hence their slack).
    # How long after the node was added that is depends on Ray, not on the plugin: a killed
    # node is known dead only once its heartbeats are missed (over 30 s on a loaded CI machine).
    entered = [float(p.name.split("-", 2)[2]) for p in entries.iterdir() if p.name.startswith(new_node.node_id)]
    slack = 0.0 if WANDB_SAMPLES_AT_JOIN else 5.0
    assert entered and joined <= min(entered) + slack, (joined, entered)
    print(
        f"replacement node's first sample {joined - added_at:.1f}s after it was added, "
        f"{min(entered) - joined:.1f}s before its workers entered; fit {fit.seconds:.1f}s"
    )
    # The dead node's writer is retired: nothing carries its label after the node went.
    late = [
        r for r in run.events if any(k.endswith(f"/l:{victim_label}") for k in r) and r["_timestamp"] > removed_at + 5
    ]
    assert late == []
    # One "node lost" alert for the dead node, and no straggler: the node table says so too. The
    # attempt the node's death ended has its own failure alert and recovery (issue 37's, with what
    # Ray knew of the rank when the attempt failed: a crashed node is known dead only later).
    attempts = failure_alerts(run)
    node_alerts = [a for a in run.alerts if a not in attempts]
    assert [(a["title"], a["severity"]) for a in node_alerts] == [(f"Node lost: {victim_label}", "ERROR")]
    # Ray knows a node gone only once its heartbeats go unanswered (killed) or its drain is known
    # (drained), and a restart it places on the node meanwhile is lost too: the fit's second retry
    # (seen in CI on Ray 2.50 and 2.55, killed and drained alike, on a loaded machine). That
    # attempt's failure is named as well, and the recovery is the next attempt's.
    failed = [a for a in attempts if a["severity"] == "ERROR"]
    assert 1 <= len(failed) <= 2, attempts
    assert [a["title"].split(":")[0] for a in failed] == [f"Attempt {i + 1}" for i in range(len(failed))], attempts
    assert [a["severity"] for a in attempts] == ["ERROR"] * len(failed) + ["INFO"], attempts
    assert attempts[0]["title"].startswith("Attempt 1: Rank"), attempts
    assert attempts[-1]["title"] == f"Attempt {len(failed) + 1} recovered", attempts
    # How Ray says it ended, as the fleet reads its listing: its ranks were on it, so it is lost
    # even within the shorter grace of a node ended on purpose (a node let go idle is left).
    import ray

    from ray_wandb_nodes._fleet.nodes import ended_nodes
    from ray_wandb_nodes._health import NodeEnd

    assert ended_nodes(ray.nodes())[victim_id] is (NodeEnd.TERMINATED if graceful else NodeEnd.CRASHED)
    assert victim_label in node_alerts[0]["text"]
    if WANDB_TABLES:
        table = {row["node"]: row for row in run.tables("nodes")[-1]}
        assert table[victim_label]["state"] == "lost"
        assert table[new_label]["state"] == "ok"
    assert [row["training_iteration"] for row in user_rows(run)] == list(range(1, len(user_rows(run)) + 1))
    assert_one_writer_per_label(run)
    assert_nothing_left()
    # The run's end, last: its exit code is sent once every node writer is done.
    wait_until(lambda: run.exit_codes != [], 30, "the run's exit code")
    assert run.exit_codes == [0]


def test_node_dies_without_replacement_fails_the_run_without_hanging(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.train import FailureConfig

    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    name = unique("no-replacement")
    failure = FailureConfig(max_failures=1, controller_failure_limit=0)
    fit = Fit(name, make_callback(finish_timeout_s=10), str(tmp_path), steps=30, sleep=0.5, failure_config=failure)
    fit.start()
    wait_until(lambda: rows_of(backend, name) >= 2, 90, "two reports")
    victim_id = next(iter(alive_logger_pids()))
    cluster.remove_node(worker_node_of(cluster, victim_id), allow_graceful=True)
    fit.join(240)
    assert not fit.is_alive(), "fit() hung"
    cluster.add_node(num_cpus=1)  # back to two worker nodes for the next tests
    error = fit.training_error()
    assert error is not None and "ray_wandb_nodes" not in repr(error)
    run = run_of(backend, name)
    assert len(run.completes) == 1 and run.exit_codes[0] not in (0, None)
    wait_until(lambda: plugin_leftovers() == ([], []), 30, "the plugin's actors to go")


def test_a_node_that_joins_mid_run_gets_a_writer(cluster: Any, backend: WandbTestBackend, tmp_path: Any) -> None:
    name = unique("node-joins")
    # Stoppable: the test ends it once it saw what it waits for; ``steps`` only bounds a fit whose
    # test failed (50 steps, 25 s, were less than the join and retire may take on a loaded machine).
    fit = Fit(name, make_callback(nodes="cluster"), str(tmp_path), steps=400, sleep=0.5, stoppable=True)
    fit.start()
    wait_until(lambda: rows_of(backend, name) >= 2, 90, "two reports")
    new_node = cluster.add_node(num_cpus=0)
    added_at = time.time()
    run = run_of(backend, name)
    new_label = node_labels()[new_node.node_id]
    # A node's first sample after it is added: its raylet's start, the fleet's next node listing
    # (3 s), its logger's process and wandb's join, the first sample (0.5 s later on wandb < 0.31):
    # about 10 s on a quiet machine, more than twice that under two streams' load: 60 s.
    wait_until(lambda: first_event_time(run, new_label) is not None, 60, "the new node's first sample")
    joined = first_event_time(run, new_label)
    assert joined is not None and joined - added_at < 60
    print(f"joining node's first sample {joined - added_at:.1f}s after it was added")
    # The autoscaler removes it again, idle (it never hosted a rank): it left, it was not lost.
    groups = len(plugin_leftovers()[1])
    cluster.remove_node(new_node)
    # The fleet sees the node gone at its next listing (every 3 s) and removes its logger's placement
    # group, which Ray's GCS drops within a second or two: about 5 s, 30 s under load.
    wait_until(lambda: len(plugin_leftovers()[1]) < groups, 30, "the fleet to retire the removed node's logger")
    assert fit.is_alive()  # seen gone while the run goes on
    fit.stop()
    fit.join(300)
    assert not fit.is_alive(), "fit() hung"
    assert fit.training_error() is None
    assert run.exit_codes == [0]
    assert [a["title"] for a in run.alerts if a["title"].startswith("Node lost")] == []
    if WANDB_TABLES:
        assert {row["node"]: row for row in run.tables("nodes")[-1]}[new_label]["state"] == "left"
    assert_one_writer_per_label(run)
    assert_nothing_left()


def test_a_killed_logger_process_comes_back_with_its_label(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("logger-killed")
    # Stoppable (``steps`` only a bound): 30 steps (15 s) could end the fit before a logger that Ray
    # restarts under load (a new process, wandb's join) rejoined, which the test waits up to 45 s for.
    fit = Fit(name, make_callback(), str(tmp_path), steps=400, sleep=0.5, stoppable=True)
    fit.start()
    wait_until(lambda: len(alive_logger_pids()) == 2 and rows_of(backend, name) >= 2, 90, "two node loggers")
    run = run_of(backend, name)
    node_id, pid = sorted(alive_logger_pids().items())[0]
    label = node_labels()[node_id]
    wait_until(lambda: bool(label_clients(run, label)), 30, "the logger's first sample")
    before = label_clients(run, label)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    wait_until(lambda: bool(label_clients(run, label) - before), 45, "the restarted logger to rejoin")

    def samples_after_the_kill() -> list[dict[str, Any]]:
        return [r for r in run.events if any(k.endswith(f"/l:{label}") for k in r) and r["_timestamp"] > killed_at + 1]

    wait_until(lambda: bool(samples_after_the_kill()), 30, "the node's samples after its logger was killed")
    fit.stop()
    fit.join(300)
    assert not fit.is_alive(), "fit() hung"
    assert fit.training_error() is None
    assert samples_after_the_kill(), "the node stopped reporting after its logger was killed"
    assert run.exit_codes == [0]  # never a second complete
    assert f"the node logger on {label} restarted; its writers rejoin" in session_log_text(cluster)
    assert_nothing_left()


def test_a_restarted_logger_says_so_even_when_its_first_status_comes_after_the_restart(cluster: Any) -> None:
    # A call in flight when the process dies is retried on the new one (max_task_retries, as the
    # pool gives it), so the controller may never see the old pid: the logger itself must say it
    # restarted.
    import ray

    from ray_wandb_nodes._fleet.actors import CALL_RETRIES
    from ray_wandb_nodes._fleet.node_logger import logger_class

    actor = logger_class().options(num_cpus=0, max_restarts=1, max_task_retries=CALL_RETRIES).remote()
    try:
        first = ray.get(actor.status.remote(), timeout=60)
        assert first.restarted is False
        os.kill(first.pid, signal.SIGKILL)
        second = ray.get(actor.status.remote(), timeout=60)
        assert second.pid != first.pid
        assert second.restarted is True
    finally:
        ray.kill(actor, no_restart=True)


def test_the_calls_on_a_dead_nodes_logger_fail_and_are_counted(cluster: Any) -> None:
    # A logger whose node is gone cannot restart (its bundle is pinned there). With Ray's retries
    # without end, a call in flight when the node went was never answered ("infinite retries
    # remaining"); bounded, it fails, and the pool's seam counts it. A call made once Ray has the
    # node dead waits for the actor's restart: the pool's drop of the node's logger (``kill``, on
    # the fleet's next node listing) ends it at once. The actor is the pool's (``create``: its
    # options, its placement group pinned to the node) with a method that holds a call in flight.
    import ray
    from ray.exceptions import RayActorError

    from ray_wandb_nodes._fleet.actors import RayActors

    class Holder:
        def hold(self) -> None:
            threading.Event().wait()

        def pid(self) -> int:
            return os.getpid()

    node = cluster.add_node(num_cpus=0)
    actors = RayActors()
    actors._actor_cls = ray.remote(Holder)  # the seam's class, as ``create`` would load NodeLogger
    actor, pg = actors.create(node.node_id, unique("dead-node-logger"))
    try:
        ray.get(actor.pid.remote(), timeout=60)  # started, on its node
        in_flight = actor.hold.remote()
        cluster.remove_node(node, allow_graceful=False)
        # A cap, not a margin: the call failed about 5 s after the node's end on a quiet machine
        # (Ray 2.60); retried without end it never would. 120 s leaves room for two streams' load.
        ready, _ = ray.wait([in_flight], timeout=120)
        assert ready == [in_flight], "a dead node's logger call in flight is still retried"
        with pytest.raises(RayActorError):
            actors.result(in_flight)
        assert actors.failed_calls == 1
        wait_until(lambda: node.node_id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}, 60, "the node's end")
        queued = actor.pid.remote()  # waits for a restart that cannot come
        actors.kill(actor, pg)  # what the pool does with a node that is gone
        ready, _ = ray.wait([queued], timeout=60)  # at once: 60 s only bounds a failing test
        assert ready == [queued], "a dropped logger's queued call is still waiting"
        with pytest.raises(RayActorError):
            actors.result(queued)
        assert actors.failed_calls == 2
    finally:
        actors.kill(actor, pg)
    assert_nothing_left()


def test_a_logger_whose_writer_waits_on_wandb_still_answers_its_pings_evidence_and_ends(
    cluster: Any, backend: WandbTestBackend
) -> None:
    """Two jobs share a node's logger; one's writer waits on W&B (here every request is held a
    minute, as a join or an upload can wait minutes). Its status, hang evidence, watches and ends
    are control calls on threads of their own: answered while the join is in flight, where a plain
    actor answered them only after it (the other job's ranks then had "no answer from node")."""
    import ray

    from ray_wandb_nodes._config.options import build_options
    from ray_wandb_nodes._config.secrets import capture_env
    from ray_wandb_nodes._config.values import Mode
    from ray_wandb_nodes._fleet.node_logger import logger_class
    from ray_wandb_nodes._hang import RankProcess, attempt_key
    from ray_wandb_nodes._wandb.writers import run_spec

    held_s = 60.0  # far past answer_s: an answer within it came while the join waited
    answer_s = 20.0  # a control call's answer on 2 loaded cores (they take milliseconds)
    name = unique("busy-logger")
    options = build_options(strategy="node", project="faults", wandb_init_kwargs={"settings": FAST})
    spec = run_spec(
        options,
        capture_env(os.environ),
        mode=Mode.ONLINE,
        run_id=name,
        name=name,
        group=None,
        label="node-a",
        config={},
    )
    actor = logger_class().options(num_cpus=0).remote()
    try:
        ray.get(actor.status.remote(), timeout=60)  # the actor is up
        backend.faults.add(delay_s=held_s, duration_s=held_s)
        join = actor.add_writer.remote(spec)
        # The join and the control calls run on threads of their own: a status asked too early is
        # answered before the join has begun. The calls are asked once the join holds the run.
        wait_until(lambda: ray.get(actor.status.remote(), timeout=answer_s).runs == (name,), 60, "the join began")
        key = attempt_key(name, 1, "00000000")
        calls = [
            actor.status.remote(),
            actor.watch.remote(key, (0,)),
            actor.hang_evidence.remote(key, [0]),
            actor.end_ranks.remote(key, [RankProcess(0, 1, 1)], "hang 1"),
            actor.unwatch.remote(key),
        ]
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=answer_s)
        assert len(ready) == len(calls), "a control call waited behind the writer's join"
        assert ray.wait([join], timeout=0)[0] == [], "the join did not wait: the test proves nothing"
        status, _, evidence, ended, _ = ray.get(calls)
        assert status.runs == (name,) and status.errors == {}  # joining: no restart, no failure
        assert evidence == () and ended.refused == (0,)
    finally:
        backend.faults.clear()
        ray.kill(actor, no_restart=True)


def test_backend_errors_then_recovers_and_every_row_arrives_once(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("backend-flaky")
    fit = Fit(name, make_callback(), str(tmp_path), steps=16, sleep=0.4)
    fit.start()
    wait_until(lambda: rows_of(backend, name) >= 2, 90, "two reports")
    backend.faults.add(status=500, path_contains="/file_stream", duration_s=4)
    time.sleep(4)
    backend.faults.add(status=429, path_contains="/file_stream", duration_s=3)
    time.sleep(3)
    backend.faults.add(drop=True, path_contains="/graphql", duration_s=2)
    fit.join(300)
    backend.faults.clear()
    assert fit.training_error() is None
    print(f"fit through 9 s of backend errors: {fit.seconds:.1f}s")
    run = run_of(backend, name)
    assert [row["training_iteration"] for row in user_rows(run)] == list(range(1, 17))
    assert [row["step"] for row in user_rows(run)] == list(range(16))
    assert run.exit_codes == [0]


def test_an_unreachable_wandb_leaves_the_end_as_fast_as_without_the_callback(
    cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens there: wandb.init retries until init_timeout_s (120 s here), far longer than
    # the training. The end must not wait for it (bound: UNCREATED_WAIT_S, 1 s, plus Ray's own
    # noise: its end's seconds differ between two fits by up to 12 s on 2 cores running two test
    # streams). An end that waited for the init would come its 120 s less the training (6 reports,
    # under 30 s loaded) later: at least 90 s, three times the 30 s allowed.
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")

    def end_of(callback: Any) -> float:
        entries = tmp_path / unique("entries")
        entries.mkdir()
        fit = Fit(unique("unreachable"), callback, str(tmp_path), steps=6, sleep=0.3, entries=str(entries))
        fit.start()
        fit.join(120)
        returned = time.time()
        assert not fit.is_alive() and fit.training_error() is None
        (done,) = [float(p.name.split("-", 1)[1]) for p in entries.iterdir() if p.name.startswith("done-")]
        return returned - done

    without = end_of(None)
    with_callback = end_of(make_callback(init_timeout_s=120))
    print(f"end: {without:.2f}s without the callback, {with_callback:.2f}s with it (W&B unreachable)")
    assert with_callback <= without + 30.0
    assert "is W&B reachable?" in session_log_text(cluster)


def test_a_backend_that_stalls_at_the_end_does_not_hold_fit(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("backend-stalls")
    fit = Fit(name, make_callback(finish_timeout_s=5), str(tmp_path), steps=4, sleep=0.3)
    fit.start()
    wait_until(lambda: rows_of(backend, name) >= 1, 90, "a report")
    backend.faults.add(delay_s=60, duration_s=120)  # every request now hangs for a minute
    fit.join(180)
    backend.faults.clear()
    assert not fit.is_alive(), "fit() waited on a stalled backend"
    print(f"fit with a stalled backend at the end: {fit.seconds:.1f}s")
    assert fit.training_error() is None
    wait_until(lambda: plugin_leftovers() == ([], []), 30, "the plugin's actors to go")


def test_a_dead_controller_leaves_no_logger_or_placement_group(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    import ray._private.state as state

    def controllers() -> dict[str, Any]:
        return {k: a for k, a in state.actors().items() if a.get("ActorClassName") == "TrainController"}

    # The cluster is shared: an earlier fit's controller may still be listed, even as alive
    # while it shuts down. Only the controller this fit starts is killed.
    earlier = set(controllers())
    name = unique("controller-dies")
    fit = Fit(name, make_callback(), str(tmp_path), steps=60, sleep=0.5)
    fit.start()
    wait_until(lambda: len(alive_logger_pids()) == 2, 90, "two node loggers")
    ours = [a for k, a in controllers().items() if k not in earlier and a.get("State") == "ALIVE"]
    assert len(ours) == 1, f"expected this fit's one controller, found {ours}"
    os.kill(ours[0]["Pid"], signal.SIGKILL)
    fit.join(120)
    assert not fit.is_alive()
    assert fit.training_error() is not None
    wait_until(
        lambda: plugin_leftovers() == ([], []),
        60,
        lambda: f"the plugin's actors and placement groups to go ({plugin_leftovers()})",
    )
    # One janitor for the job: the module's fits and the killed controller's all registered with
    # it, and it lives on (idle) with the job, on the driver's node (which no fault here removes).
    import ray

    job, head = ray.get_runtime_context().get_job_id(), ray.get_runtime_context().get_node_id()
    janitors = [
        a for a in state.actors().values() if a["ActorClassName"].endswith("LoggerJanitor") and a["JobID"] == job
    ]
    assert [(a["State"], a["Address"]["NodeID"]) for a in janitors] == [("ALIVE", head)], [
        (a["State"], a["Address"]["NodeID"][:8], a["DeathCause"]) for a in janitors
    ]
