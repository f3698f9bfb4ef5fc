"""The rank's side of the step anatomy: the recorder's totals from the hooks torch calls, on a
clock the test controls, and the hooks themselves on real torch (optimizer steps, DataLoader
iterators, a DDP over gloo with one rank)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

from ray_wandb_nodes._steps import RegionWriter, Sources, StepRecorder, StepTotals, decode
from ray_wandb_nodes._steps.recorder import PUBLISH_EVERY, READ_EVERY, SLOW_STEP_NS
from ray_wandb_nodes._worker.step_inputs import Current, TimeRayData, timed_fetch

MS = 1_000_000


class Rank:
    """A recorder on a clock the test moves, with a timed fetch that takes ``input`` ms."""

    def __init__(self, offset: int = 0) -> None:
        self.t = offset
        self.region = bytearray(256)
        self.recorder = StepRecorder(RegionWriter(self.region), clock=lambda: self.t)
        self.recorder.hooks_in_place()
        current = Current()
        current.recorder = self.recorder
        self.fetch = timed_fetch(current, self._wait)
        self._input = 0

    def _wait(self, _: Any) -> int:
        self.t += self._input
        return 1

    def step(self, input_ms: float = 5, busy_ms: float = 20, optimizer_ms: float = 2) -> None:
        self._input = int(input_ms * MS)
        self.fetch(None)
        self.t += int(busy_ms * MS)
        self.recorder.optimizer_pre()
        self.t += int(optimizer_ms * MS)
        self.recorder.optimizer_post()

    def read(self) -> StepTotals | None:
        return decode(bytes(self.region))


def test_each_step_interval_after_the_first_step_is_counted_with_its_parts() -> None:
    rank = Rank()
    for _ in range(4):
        rank.step(input_ms=5, busy_ms=20, optimizer_ms=2)
    t = rank.recorder.publish()
    assert (t.steps, t.intervals, t.batches) == (4, 3, 3)  # the time before the first step is no step
    assert t.step_ns == 3 * 27 * MS
    assert t.input_ns == 3 * 5 * MS
    assert t.optimizer_ns == 3 * 2 * MS
    assert t.sources == Sources.INPUT | Sources.OPTIMIZER


def test_an_interval_left_out_counts_its_step_but_none_of_its_parts() -> None:
    rank = Rank()
    rank.step()
    rank.step()
    rank.recorder.leave_out_interval()  # an evaluation pass in this interval
    rank.step(input_ms=500, busy_ms=900)
    rank.step()
    t = rank.recorder.publish()
    assert (t.steps, t.intervals) == (4, 2)
    assert t.step_ns == 2 * 27 * MS and t.input_ns == 2 * 5 * MS


def test_an_optimizer_stepping_another_inside_its_step_is_one_step() -> None:
    rank = Rank()
    for _ in range(3):
        rank.recorder.optimizer_pre()  # a wrapper's step (Accelerate's, Ray's) ...
        rank.recorder.optimizer_pre()  # ... around the torch optimizer's
        rank.t += 2 * MS
        rank.recorder.optimizer_post()
        rank.recorder.optimizer_post()
        rank.t += 10 * MS
    t = rank.recorder.publish()
    assert (t.steps, t.intervals, t.optimizer_ns) == (3, 2, 2 * 2 * MS)


def test_a_fetch_inside_a_timed_fetch_is_timed_once() -> None:
    rank = Rank()
    current = Current()
    current.recorder = rank.recorder
    inner = timed_fetch(current, lambda _: rank.fetch(None))  # a loader over a timed iterable
    rank._input = 7 * MS
    rank.recorder.optimizer_post()  # a first step: what follows is counted
    inner(None)
    rank.recorder.optimizer_post()
    assert rank.recorder.publish().input_ns == 7 * MS


def test_the_end_of_an_epoch_is_input_time_but_no_batch() -> None:
    rank = Rank()
    current = Current()
    current.recorder = rank.recorder

    def exhausted(_: Any) -> Any:
        rank.t += 3 * MS
        raise StopIteration

    rank.recorder.optimizer_post()
    with pytest.raises(StopIteration):
        timed_fetch(current, exhausted)(None)
    rank.recorder.optimizer_post()
    t = rank.recorder.publish()
    assert (t.input_ns, t.batches) == (3 * MS, 0)
    assert rank.recorder.inside is False


def test_fast_steps_publish_every_32nd_step_and_slow_steps_every_step() -> None:
    rank = Rank()
    published = []
    for _ in range(2 * PUBLISH_EVERY):
        rank.step(input_ms=1, busy_ms=2, optimizer_ms=1)
        read = rank.read()
        published.append(read.steps if read else None)
    assert published == [None] * (PUBLISH_EVERY - 1) + [PUBLISH_EVERY] * PUBLISH_EVERY + [2 * PUBLISH_EVERY]
    slow = int(SLOW_STEP_NS / MS)
    rank.step(busy_ms=slow)
    rank.step(busy_ms=slow)
    assert rank.read().steps == 2 * PUBLISH_EVERY + 2  # type: ignore[union-attr]


def test_the_totals_are_the_same_whatever_the_rank_s_clock_reads() -> None:
    a, b = Rank(offset=0), Rank(offset=12 * 86_400 * 10**9 + 7)
    for rank in (a, b):
        for i in range(20):
            rank.step(input_ms=1 + i % 3, busy_ms=10 + i % 5)
    assert a.recorder.publish() == b.recorder.publish()


def test_a_failing_region_turns_the_anatomy_off_and_the_optimizer_never_sees_it() -> None:
    rank = Rank()

    class Broken(RegionWriter):
        def write(self, sources: int, *totals: int) -> None:
            raise OSError("region unmapped")

    rank.recorder._writer = Broken(bytearray(256))
    for _ in range(PUBLISH_EVERY + 2):
        rank.step()  # raises nothing
    assert rank.recorder.failed == "OSError: region unmapped"


# real torch ---------------------------------------------------------------------------------------
@pytest.fixture
def armed() -> Iterator[tuple[StepRecorder, bytearray]]:
    pytest.importorskip("torch")
    from ray_wandb_nodes._worker.steps import arm_steps, disarm_steps

    region = bytearray(256)
    recorder = arm_steps(region)
    try:
        yield recorder, region
    finally:
        disarm_steps()


def test_a_real_dataloader_and_optimizer_feed_an_armed_rank_with_no_code(armed: tuple[StepRecorder, bytearray]) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    recorder, region = armed
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([param], lr=0.1)
    for batch in DataLoader(TensorDataset(torch.ones(24, 4)), batch_size=4):
        (param * batch[0]).sum().backward()
        opt.step()
    t = recorder.publish()
    assert (t.steps, t.intervals, t.batches) == (6, 5, 5)
    assert t.sources & (Sources.INPUT | Sources.OPTIMIZER) == Sources.INPUT | Sources.OPTIMIZER
    assert 0 < t.input_ns < t.step_ns and 0 < t.optimizer_ns < t.step_ns
    assert decode(bytes(region)) == t


def test_disarmed_the_hooks_count_nothing(armed: tuple[StepRecorder, bytearray]) -> None:
    import torch

    from ray_wandb_nodes._worker.steps import arm_steps, disarm_steps

    recorder, _ = armed
    assert arm_steps(bytearray(256)) is recorder  # armed once a process
    disarm_steps()
    param = torch.nn.Parameter(torch.ones(1))
    param.grad = torch.ones(1)
    torch.optim.SGD([param], lr=0.1).step()
    assert recorder.steps == 0


# DDP over gloo in a process of its own, which prints what it read and ends with os._exit: torch
# 2.13 stashes a Python object (the backward's contextvars) in the thread-local state each of a
# backward's allreduce works keeps, so a gloo worker thread that drops the last reference to such
# a work must take the GIL, while the process group's destructor, run under the GIL when the last
# DDP reference goes, joins that thread: a deadlock, by chance (pytorch/pytorch#182083). It hung
# this suite once in CI. Skipping the destructor at the child's exit cannot meet it.
_GLOO_DDP = """
import dataclasses, json, os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from ray_wandb_nodes._steps import CPU_RATE
from ray_wandb_nodes._worker.steps import arm_steps

recorder = arm_steps(bytearray(256))
store, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
ddp = DistributedDataParallel(torch.nn.Linear(8, 1))
armed = ddp.reducer is not None and recorder._ddp is not None and recorder._ddp.rate == CPU_RATE
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
samples = {}  # the sampled iterations' backward compute, one by one
for _ in range(steps):
    ddp(torch.ones(4, 8)).sum().backward()
    opt.step()
    ints = ddp.logger._get_ddp_logging_data().ints_map
    if ints.get("iteration"):
        samples[ints["iteration"]] = ints["backward_compute_time"]
t = recorder.publish()
print(json.dumps({"armed": armed, "samples": sorted(samples.items()), "totals": dataclasses.asdict(t)}), flush=True)
os._exit(0)
"""


def run_child(script: str, *args: str) -> str:
    """``script`` run by a Python of its own in the repository (nothing of this process's
    environment but ``PATH``'s basics, one thread for torch's ops); its stdout, once it exited 0."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=repo,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=300,  # a bound on a hang: a healthy child takes seconds
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_ddp_over_gloo_is_read_for_its_timers_with_no_code(tmp_path: Any) -> None:
    import json

    pytest.importorskip("torch")
    from ray_wandb_nodes._steps import CPU_RATE, sampled_iterations

    steps = 400  # 40 timed: 1 to 10, then every 13th (CPU_RATE)
    out = json.loads(run_child(_GLOO_DDP, str(tmp_path / "store"), str(steps)).strip().splitlines()[-1])
    assert out["armed"], out
    samples = dict(out["samples"])
    t = StepTotals(**{**out["totals"], "sources": Sources(out["totals"]["sources"])})
    assert Sources.DDP in t.sources and Sources.DDP_DEVICE not in t.sources
    timed = [i for i in range(1, steps) if i <= 10 or i % CPU_RATE == 0]  # the last forward set the one before's
    assert sorted(samples) == timed
    assert t.ddp_iteration == timed[-1]
    assert t.ddp_samples == sampled_iterations(timed[-1], CPU_RATE) == len(samples) == len(timed)
    # DDP's running mean times its count, with what its integer divisions dropped added back on
    # average (n (n - 1) / 4 ns), is the sum of its samples: the rest is random, of spread about
    # n^1.5 / 6 ns (the k-th division drops 0 to k - 1 ns). Within four spreads: wrong once in
    # 16,000 runs by chance (three failed about once in 400 when this test took 12 samples), and
    # with 40 samples the added-back term (390 ns) is over twice that bound, so it is proven.
    n = len(samples)
    assert n == 40 and n * (n - 1) / 4 > 2 * (4 * n**1.5 / 6)
    assert abs(t.backward_ns - sum(samples.values())) <= 4 * n**1.5 / 6


def test_ray_data_s_batch_iterables_are_timed() -> None:
    rank = Rank()
    current = Current()
    current.recorder = rank.recorder

    class DataIterator:
        def iter_torch_batches(self, **_: Any) -> list[int]:
            return [1, 2, 3]

        def iter_batches(self, **_: Any) -> list[int]:
            return [4]

    module = types.ModuleType("ray.data.iterator")
    module.DataIterator = DataIterator  # type: ignore[attr-defined]
    TimeRayData(current)(module)
    TimeRayData(current)(module)  # once a class
    rank.recorder.optimizer_post()
    assert list(DataIterator().iter_torch_batches(batch_size=2)) == [1, 2, 3]
    assert list(DataIterator().iter_batches()) == [4]
    rank.recorder.optimizer_post()
    assert rank.recorder.publish().batches == 4


def test_a_fetch_on_another_thread_than_the_one_stepping_is_not_its_wait() -> None:
    import threading

    rank = Rank()
    rank.step()  # the training thread is the one that ends steps
    rank._input = 50 * MS
    prefetcher = threading.Thread(target=rank.fetch, args=(None,))  # a user's prefetching thread
    prefetcher.start()
    prefetcher.join()
    rank.step(input_ms=4)
    t = rank.recorder.publish()
    assert (t.input_ns, t.batches) == (4 * MS, 1)


def test_armed_before_torch_is_imported_the_hooks_go_in_as_it_is() -> None:
    """The order on a Ray worker: the plugin arms the rank before the train function imports torch."""
    pytest.importorskip("torch")
    script = """
import sys
from ray_wandb_nodes._steps import Sources
from ray_wandb_nodes._worker.steps import arm_steps
assert "torch" not in sys.modules
recorder = arm_steps(bytearray(256))
import torch
from torch.utils.data import DataLoader
param = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([param], lr=0.1)
for batch in DataLoader(torch.ones(12, 2), batch_size=3):
    (param * batch).sum().backward()
    opt.step()
t = recorder.publish()
assert (t.steps, t.intervals, t.batches) == (4, 3, 3), t
assert t.sources == Sources.INPUT | Sources.OPTIMIZER, t
print("ok")
"""
    assert run_child(script).strip() == "ok"


def test_a_ddp_whose_timers_cannot_be_read_leaves_the_other_parts_measured() -> None:
    rank = Rank()

    class OtherTorch:  # a release whose DDP keeps its logging data elsewhere
        device_type, reducer, logger = "cpu", object(), object()

        def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
            pass

    rank.recorder.attach_ddp(OtherTorch())
    for _ in range(READ_EVERY + 6):  # past a DDP read
        rank.step()
    t = rank.recorder.publish()
    assert rank.recorder.failed == ""
    assert (t.steps, t.ddp_samples) == (READ_EVERY + 6, 0)
    assert t.sources == Sources.INPUT | Sources.OPTIMIZER
