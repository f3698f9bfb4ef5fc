"""The run's final judgement: at its end, each node writer's last, partial transaction-log block
(the SM clock and ECC counts no ping could carry) is read once the writer has finished, and judged
before the primary finishes, so that a GPU failure that ended the run is in the run."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.block_delivery import _Run, _Tail, stats_record
from ray_wandb_nodes._fleet.health import judge_final
from ray_wandb_nodes._fleet.hosted import HostedRun
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.pool import LoggerPool
from ray_wandb_nodes._fleet.retire import Retirement
from ray_wandb_nodes._fleet.targets import SharedTarget
from ray_wandb_nodes._health import HealthMonitor, HealthOptions, SummaryReader
from ray_wandb_nodes._wandb.txlog import BLOCK_SIZE, LogTail
from ray_wandb_nodes._warn import Warner
from tests.support.fakes import ints, logger_status, summary
from tests.support.offline import offline_run

__all__ = ["offline_run"]  # the shared fixture, imported for pytest to find


# the log's tail --------------------------------------------------------------------------------
def test_a_finished_logs_last_partial_block_is_read_once_it_holds_the_exit_record(
    offline_run: dict[str, Any], tmp_path: Path
) -> None:
    source = Path(offline_run["files"]["node-primary-aaaaaa"])  # a wide row: more than one block
    whole = source.read_bytes()
    assert len(whole) > BLOCK_SIZE and len(whole) % BLOCK_SIZE
    everything = [r.WhichOneof("record_type") for r in _records(source)]
    path = tmp_path / "run.wandb"
    path.write_bytes(whole[: len(whole) - 40])  # the writer's finish returned; its log is not all out yet
    tail = LogTail(str(path))
    live = [r.WhichOneof("record_type") for r in tail.read()]  # the complete blocks only, as while it runs
    assert live == everything[: len(live)] and len(live) < len(everything)
    assert tail.read(to_end=True) == [] and not tail.ended and tail.error is None  # cut mid-chunk: later
    shutil.copyfile(source, path)  # written out
    rest = [r.WhichOneof("record_type") for r in tail.read(to_end=True)]
    assert live + rest == everything and rest[-1] == "exit" and tail.ended
    assert tail.read(to_end=True) == []  # read once


def test_a_live_log_s_partial_block_waits_for_the_writer_s_end(offline_run: dict[str, Any]) -> None:
    tail = LogTail(offline_run["files"]["node-w1-bbbbbb"])  # one partial block
    assert tail.read() == [] and tail.read() == [] and not tail.ended  # a live writer's: not read
    rest = tail.read(to_end=True)
    assert rest[-1].WhichOneof("record_type") == "exit" and tail.ended


def _records(path: Path) -> list[Any]:
    return LogTail(str(path)).read(to_end=True)


# the node's reader -----------------------------------------------------------------------------
def test_a_finished_writer_s_last_summary_carries_its_partial_block() -> None:
    tail, run = _Tail(), _Run()
    reader = SummaryReader(tail=lambda path: tail)
    tail.records = [stats_record(t, {"gpu.0.uncorrectedMemoryErrors": 0.0}) for t in (1.0, 2.0)]
    run._system_metrics = {"cpu": [(2.0, 40.0)]}
    reader.read(run)
    assert [b.t for b in reader.take().gpu_ints] == [2.0]  # type: ignore[union-attr]
    # the GPU's memory fails; the block holding it is still being written when the writer finishes
    tail.partial = [stats_record(t, {"gpu.0.uncorrectedMemoryErrors": 2.0}) for t in (3.0, 4.0)]
    run._system_metrics = {"cpu": [(2.0, 40.0), (4.0, 40.0)]}
    reader.read(run)
    assert [b.t for b in reader.take().gpu_ints] == [2.0]  # type: ignore[union-attr]
    last = reader.final(run, wait_s=0.0)
    assert last is not None and last.t == 4.0
    assert [(b.t, b.by[0].ecc_u) for b in last.gpu_ints] == [(4.0, 2.0)]  # carried twice before: only the new one


def test_a_log_that_is_never_written_out_is_waited_for_within_the_bound() -> None:
    class Stuck(_Tail):  # the writer's last block never comes
        def read(self, to_end: bool = False) -> list[Any]:
            return []

    tail, run = Stuck(), _Run()
    run._system_metrics = {"cpu": [(1.0, 40.0)]}
    reader = SummaryReader(tail=lambda path: tail)
    reader.read(run)
    import time

    start = time.monotonic()
    last = reader.final(run, wait_s=0.2)
    # At least the bound, and well under FINAL_WAIT_S (2 s, what a reader ignoring wait_s would
    # wait): 1.3 s over the bound leave its 20 ms polls room on 2 loaded cores.
    assert last is not None and last.gpu_ints == () and 0.2 <= time.monotonic() - start < 1.5


def test_a_node_logger_s_finish_answers_with_the_writer_s_last_summary() -> None:
    from ray_wandb_nodes._fleet import node_logger

    class Writer(_Run):
        def __init__(self, tail: _Tail) -> None:
            super().__init__()
            self.tail, self.finished = tail, False

        def finish(self) -> None:  # the block being written goes out with the finish
            self.finished = True
            self.tail.records += self.tail.partial
            self.tail.partial = []

    tail = _Tail()
    writer = Writer(tail)
    writer._system_metrics = {"cpu": [(1.0, 40.0)]}
    tail.partial = [stats_record(1.0, {"gpu.0.uncorrectedMemoryErrors": 2.0})]
    logger = node_logger.NodeLogger()
    logger._hosted["run-a"] = HostedRun("run-a", run=writer, reader=SummaryReader(tail=lambda path: tail))
    logger.status = lambda final=None, ended=(): logger_status("n1", 1, final=final)  # type: ignore[method-assign]
    status = logger.finish("run-a")  # (the real status asks Ray for the node's id)
    assert writer.finished and status.runs == ()
    assert [b.by[0].ecc_u for b in status.final["run-a"].gpu_ints] == [2.0]


# the driver side: judged before the primary finishes ---------------------------------------------
class Primary:
    """What the final judgement hands the run's primary, in order."""

    def __init__(self, said: list[str]) -> None:
        self.spec = SimpleNamespace(run_id="run-a")
        self.index, self.summary, self.ready, self.read_problems = None, None, True, ()
        self.said = said

    def alert(self, alert: Any) -> None:
        self.said.append(f"{alert.level} {alert.title}")

    def log_health(self, stragglers: Any, table: Any, gpu_table: Any) -> None:
        self.said.append(f"tables {len(gpu_table or [])} GPU rows")


class Answered:
    """The pool's Ray calls: every finish has answered, with the status it was given."""

    def __init__(self, statuses: dict[Any, Any]) -> None:
        self.statuses = statuses

    def group_prefix(self) -> str:
        return "g-"

    def create(self, node_id: str, name: str) -> tuple[None, None]:
        return None, None

    def answered(self, refs: list[Any]) -> set[Any]:
        return set(refs)

    def result(self, ref: Any) -> Any:
        return self.statuses[ref]


def test_a_rank_s_gpu_errors_in_the_last_block_are_alerted_before_the_primary_finishes() -> None:
    said: list[str] = []
    health = HealthMonitor(HealthOptions(window_s=3.0))
    target = SharedTarget(primary=Primary(said), nodes={"n1"}, health=health)  # type: ignore[arg-type]
    target.ready = True
    health.set_nodes({"n1": ("node-a", "host-a")}, {"n1": (0,)}, rank_gpus={0: ("0",)})
    health.summary("n1", summary(1.0, gpus={0: _busy()}, ints={0: ints(1980.0)}))  # what the pings brought
    health.tick()
    # the node writer's finish answers with its last summary: the partial block shows 2 errors
    last = summary(5.0, gpus={0: _busy()}, ints={0: ints(1980.0, ecc_u=2.0)}, ints_span=(4.0, 5.0, 2))
    statuses = {"finish-ref": logger_status("n1", 7, final={"run-a": last})}
    pool = LoggerPool(init_timeout_s=1.0, warner=Warner(), ping_s=1.0, actors=Answered(statuses))  # type: ignore[arg-type]
    pool.start([NodeInfo("n1", "host-a", "10.0.0.1")])
    handle = pool.get("n1")
    r = Retirement(
        "run-a",
        {"finish-ref": handle},
        deadline=0.0,
        timeout=1.0,
        then=lambda: said.append("finish"),
        writers_done=threading.Event(),
        judge=lambda last: judge_final(target, Warner(), last),
    )
    assert r.advance(pool, None, Warner(), final=False) is False  # type: ignore[arg-type]
    assert said == ["ERROR GPU memory errors: node-a GPU 0", "tables 1 GPU rows", "finish"]
    assert "rank 0" in health.raised[0].text and ": 2, up from 0" in health.raised[0].text


def test_a_writer_that_did_not_finish_in_time_leaves_the_final_judgement_what_the_pings_brought() -> None:
    said: list[str] = []
    health = HealthMonitor(HealthOptions())
    target = SharedTarget(primary=Primary(said), nodes={"n1"}, health=health)  # type: ignore[arg-type]
    target.ready = True
    health.set_nodes({"n1": ("node-a", "host-a")}, {"n1": (0,)}, rank_gpus={0: ("0",)})
    health.summary("n1", summary(1.0, gpus={0: _busy()}, ints={0: ints(1980.0)}))

    class Silent(Answered):
        def answered(self, refs: list[Any]) -> set[Any]:
            return set()

    pool = LoggerPool(init_timeout_s=1.0, warner=Warner(), ping_s=1.0, actors=Silent({}))  # type: ignore[arg-type]
    pool.start([NodeInfo("n1", "host-a", "10.0.0.1")])
    r = Retirement(
        "run-a",
        {"finish-ref": pool.get("n1")},
        deadline=0.0,  # passed
        timeout=1.0,
        then=lambda: said.append("finish"),
        writers_done=threading.Event(),
        judge=lambda last: judge_final(target, Warner(), last),
    )
    assert r.advance(pool, None, Warner(), final=False) is False  # type: ignore[arg-type]
    assert said == ["tables 1 GPU rows", "finish"]  # the last tables still come first


def _busy() -> Any:
    from tests.support.fakes import gpu

    return gpu(97.0)
