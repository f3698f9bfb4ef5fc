"""Failures in the shapes real jobs fail in, named on hosts of their own (``tests/support/hosts.py``:
each host its own network, hostname, ``/dev/shm`` and processes, so each node's logger sees only
its own ranks' files and logs). The memory kills are ``test_memory``'s (hosts with memory limits).

**The stuck rank behind a collective timeout.** One fit of four ranks over gloo, two a host, with
one retry (``FailureConfig(max_failures=1)``) and torch's process-group timeout at 15 s
(``TorchConfig(timeout_s=15)``); hang detection off, so the judgement rests on the ranks' own
records alone (with it on, the hang alert comes first and its verdict is the judgement):

- attempt 1: rank 1 stops in its own code (a stalled read: alive, in no collective) at step 3;
  ranks 0, 2 and 3 enter the next all-reduce and wait out gloo's timeout, each raising
  ``RuntimeError: ... Timed out waiting 15000ms for recv operation``;
- attempt 2 (Ray restarts the job) trains again (its recovery), then rank 1 stops again; the
  waiters end as NCCL's watchdog ends them: its lines on stderr, then ``SIGABRT``, no Python
  exception. No retry is left: the run fails.

Each failed attempt: one ERROR alert that names rank 1, its host and where it stood, and the
others as the ranks that timed out waiting for it in that all-reduce; no other rank blamed.

**A DataLoader worker's exception.** Two ranks, each reading a DataLoader with one worker process;
rank 1's worker raises at sample 17: the run names rank 1 with the worker's own exception and
frame, not torch's "Caught ValueError in DataLoader worker process 0." at the loop.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import node_labels
from tests.support.hosts import HostCluster
from tests.support.runs import failure_alerts, run_of, unique
from tests.support.training import fit_within, make_callback, trainer
from tests.support.wandb_backend import WandbTestBackend

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORLD, STUCK, STUCK_AT = 4, 1, 3
# torch's process-group timeout: how long the waiters wait. Long enough that four ranks over gloo
# on 2 loaded cores finish each step's all-reduce well inside it (a step here is milliseconds; the
# first all-reduce after the group's set-up took up to 2 s), short enough for a test.
PG_TIMEOUT_S = 15


@pytest.fixture(scope="module")
def backend(hosts: HostCluster) -> WandbTestBackend:
    return hosts.backend


def read_next_batch(folder: str, attempt: int) -> None:
    """A data read that stalls for good (a file system that stopped answering): Ray ends it."""
    Path(folder, f"stuck-{attempt}").touch()
    while not os.path.exists(os.path.join(folder, "never")):
        time.sleep(0.05)  # <stalled read>


def watchdog_abort(rank: int, seq: int, timeout_ms: int) -> None:
    """End this rank as torch's NCCL watchdog ends a rank that waited out a collective: its lines
    (torch 2.13's ``ProcessGroupNCCL.cpp`` words), then SIGABRT, no Python exception."""
    sys.stderr.write(
        f"[rank{rank}]:[E1206 07:10:31.413000000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
        f" Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, "
        f"NumelOut=1, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 67} milliseconds before timing out.\n"
        f"[rank{rank}]:[E1206 07:10:31.414000000 ProcessGroupNCCL.cpp:2159] [PG ID 0 PG GUID 0(default_pg) Rank "
        f"{rank}] Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL "
        f"work: {seq}, last completed NCCL work: {seq - 1}.\n"
        f"[rank{rank}]:[E1206 07:10:31.415000000 ProcessGroupNCCL.cpp:681] [Rank {rank}] To avoid data "
        "inconsistency, we are taking the entire process down.\n"
    )
    sys.stderr.flush()
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core to write: it ends at once, as the watchdog's does
    os.abort()


class Samples:
    """A map-style data set whose sample 17 is bad on rank 1 (read in a DataLoader worker)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> Any:
        import torch

        if self.rank == 1 and index == 17:
            raise ValueError(f"bad sample {index}")  # <bad sample>
        return torch.ones(2)


def dataloader_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    rank = ray.train.get_context().get_world_rank()
    loader = DataLoader(Samples(rank), batch_size=1, num_workers=1)
    for step, batch in enumerate(loader):
        dist.all_reduce(batch)
        ray.train.report({"step": step})


def timeout_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    # Rank 1 marks its stall at step 3 of attempt 1, after every rank has read this at its start.
    attempt = 2 if os.path.exists(os.path.join(config["dir"], "stuck-1")) else 1
    Path(config["dir"], f"node-{attempt}-{rank}").write_text(ray.get_runtime_context().get_node_id())
    group = dist.distributed_c10d._get_default_group()
    for step in range(100):
        if rank == STUCK and step == STUCK_AT:
            read_next_batch(config["dir"], attempt)
        value = torch.ones(1)
        try:
            dist.all_reduce(value)  # <all_reduce>
        except RuntimeError:
            if attempt == 2:
                watchdog_abort(rank, group._get_sequence_number_for_group(), PG_TIMEOUT_S * 1000)
            raise
        ray.train.report({"step": step, "attempt": attempt})


def test_the_rank_behind_a_collective_timeout_is_named_the_cause_on_each_attempt(
    hosts: HostCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    folder = tmp_path_factory.mktemp("timeouts")  # under pytest's base temp: every host sees it
    name = unique("timeouts")
    made = trainer(
        timeout_loop,
        torch=True,
        train_loop_config={"dir": str(folder)},
        torch_config=TorchConfig(backend="gloo", timeout_s=PG_TIMEOUT_S),
        scaling_config=ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(
            name=name,
            storage_path=str(folder / "storage"),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[make_callback(hang_timeout_s=None)],
        ),
    )
    result = fit_within(made, 600)
    assert isinstance(result, BaseException) or result.error is not None, result  # no retry left: failed

    run = run_of(hosts.backend, name)
    assert run.exit_codes and run.exit_codes[-1] not in (None, 0), run.exit_codes
    labels = node_labels()
    alerts = failure_alerts(run)
    assert [(a["title"].split(":")[0], a["severity"]) for a in alerts] == [
        ("Attempt 1", "ERROR"), ("Attempt 2 recovered", "INFO"), ("Attempt 2", "ERROR"),
    ], [a["title"] for a in alerts]  # fmt: skip
    # The waiters named are those Ray's poll and the nodes saw end by the decision: NCCL-style aborts
    # a moment apart (a process may still be dumping as the facts are asked) may leave one out.
    # Whoever is named a waiter is one of them, and no other rank is ever blamed.
    title = re.compile(rf"Attempt \d: Rank {STUCK} stuck: (ranks? [\d,-]+) timed out waiting in all_reduce "
                       rf"#{STUCK_AT + 1} of the default group$")  # fmt: skip
    for attempt, alert in ((1, alerts[0]), (2, alerts[2])):
        found = title.match(alert["title"])
        assert found is not None, alert
        assert set(expand(found.group(1))) <= {0, 2, 3} and expand(found.group(1)), alert["title"]
        text = alert["text"]
        # Rank 1 on its host in that attempt (Ray may place it elsewhere on a restart), where it stood.
        host = hosts.host_of((folder / f"node-{attempt}-{STUCK}").read_text())
        assert f"Rank {STUCK} on {labels[host.node_id]}" in text, text
        where = f"where it stood as Ray stopped it: test_failure_shapes.py:{line_of('stalled read')} in read_next_batch"
        assert where in text, text
        assert f"never entered #{STUCK_AT + 1} (its last: #{STUCK_AT})" in text, text
        assert f": timed out after {PG_TIMEOUT_S} s in all_reduce #{STUCK_AT + 1}" in text, text
        assert "Also failed at once" not in text and "SIGKILL" not in text, text
    assert "Ray restarts the job: attempt 2" in alerts[0]["text"]
    assert "No retries left" in alerts[2]["text"]
    summary = run.summary["failure"]
    assert (summary["attempt"], summary["kind"], summary["rank"]) == (2, "stuck", STUCK), summary
    # The waiters' own accounts, in the files of the second attempt: NCCL's watchdog, SIGABRT.
    consequences = run.files["failures/attempt-2/consequences.txt"].decode()
    assert f"NCCL's watchdog timed out all_reduce #{STUCK_AT + 1} of process group 0" in consequences, consequences
    for alert in alerts:  # what the run received, for the failures page
        print(f"{alert['severity']} {alert['title']}\n{alert['text']}\n")


def test_a_dataloader_workers_exception_is_named_as_the_workers_own_on_each_attempt(
    hosts: HostCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    folder = tmp_path_factory.mktemp("dataloader")
    name = unique("dataloader")
    made = trainer(
        dataloader_loop,
        torch=True,
        torch_config=TorchConfig(backend="gloo", timeout_s=PG_TIMEOUT_S),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(
            name=name,
            storage_path=str(folder / "storage"),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[make_callback()],
        ),
    )
    result = fit_within(made, 600)
    assert isinstance(result, BaseException) or result.error is not None, result  # the same sample each attempt
    run = run_of(hosts.backend, name)
    alerts = failure_alerts(run)
    cause = "Rank 1 failed: ValueError in DataLoader worker 0: bad sample 17"
    assert [a["title"] for a in alerts] == [f"Attempt 1: {cause}", "Attempt 2 recovered", f"Attempt 2: {cause}"]
    where = f"test_failure_shapes.py:{line_of('bad sample')} in __getitem__"
    for alert in (alerts[0], alerts[2]):
        text = alert["text"]
        assert f"at {where}" in text, text
        assert "Also failed at once" not in text and "Rank 0" not in text.split("What followed")[0], text
    assert run.summary["failure"]["where"] == where


def expand(ranks: str) -> list[int]:
    """``rank 0`` / ``ranks 0,2-3`` as the ranks they name."""
    out: list[int] = []
    for part in ranks.split(" ", 1)[1].split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def line_of(marker: str) -> int:
    for number, text in enumerate(Path(__file__).read_text().splitlines(), 1):
        if f"# <{marker}>" in text:
            return number
    raise AssertionError(marker)
