"""The progress beacon: what a rank stamps is what the node reads, from another process, never torn;
slots of dead processes and foreign files are skipped."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ray_wandb_nodes._hang.beacon import (
    CADENCE_BUCKET_NS,
    EXTENSION_AT,
    MAGIC,
    SLOT_SIZE,
    VERSION,
    Beacon,
    Phase,
    default_root,
    install_step_hook,
    progress_of,
    read_slot,
    read_slots,
    slot_path,
)
from ray_wandb_nodes._hang.policy import auto_running_limit_s, limit_s, parse_hang_timeout
from tests.support.child import python_child

REPO = Path(__file__).resolve().parents[3]


def test_a_new_slot_reads_as_not_started(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 2)
    [slot] = read_slots(tmp_path)
    assert (slot.rank, slot.pid, slot.reports, slot.steps, slot.started) == (2, os.getpid(), 0, 0, False)
    assert slot.phase is Phase.RUNNING and slot.dump_signal == 0
    assert slot.thread_ident == 0  # no thread stamped progress yet (the arming thread is not the training one)
    assert slot.path == slot_path(tmp_path, 2, os.getpid())
    beacon.report()
    assert read_slots(tmp_path)[0].thread_ident == threading.get_ident()
    beacon.close()
    assert read_slots(tmp_path) == []


def test_steps_reports_and_phases_are_read_back(tmp_path: Path) -> None:
    clock = Clock()  # moved by the test (below): the intervals are exact, whatever the machine's load
    beacon = Beacon(tmp_path, 0, clock=clock)
    clock.wait(3.0)  # before the first step: no cadence
    beacon.step()
    clock.wait(0.05)
    beacon.step()
    beacon.report()
    with beacon.in_phase(Phase.CHECKPOINTING):
        assert read_slots(tmp_path)[0].phase is Phase.CHECKPOINTING
        clock.wait(2.0)  # a long phase is not the job's cadence
    beacon.step()
    beacon.set_dump_signal(12)
    [slot] = read_slots(tmp_path)
    assert (slot.steps, slot.reports, slot.phase, slot.dump_signal) == (3, 1, Phase.RUNNING, 12)
    # The slowest interval is the 50 ms between the two steps: neither the time before the first
    # step nor the checkpoint counts.
    clock.wait(1.0)
    assert slot.slowest_recent_ns(clock()) == 50 * 10**6
    progress = progress_of(slot, clock())
    assert progress.started and progress.age_s == 1.0
    assert progress.slowest_interval_s == 0.05
    beacon.close()


def test_age_before_the_first_progress_counts_from_the_slot(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 0)
    [slot] = read_slots(tmp_path)
    assert progress_of(slot, slot.start_ns + 7_000_000_000).age_s == pytest.approx(7.0)
    assert progress_of(slot, slot.start_ns + 7_000_000_000).slowest_interval_s is None
    beacon.close()


def test_a_write_under_way_is_never_returned(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 0)
    beacon.step()
    with open(beacon.path, "r+b") as f:
        f.write(struct.pack("<Q", 7))  # an odd sequence: a writer stopped mid-write
    assert read_slot(beacon.path) is None
    beacon.step()  # the writer's next stamp makes it whole again
    assert read_slots(tmp_path)[0].steps == 2
    beacon.close()


def test_foreign_files_and_other_versions_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "rank-0.1.slot").write_bytes(b"\0" * SLOT_SIZE)
    (tmp_path / "rank-1.2.slot").write_bytes(b"short")
    wrong = bytearray(SLOT_SIZE)
    struct.pack_into("<IH", wrong, 8, MAGIC, 99)
    (tmp_path / "rank-2.3.slot").write_bytes(bytes(wrong))
    assert read_slots(tmp_path) == []
    assert read_slots(tmp_path / "missing") == []


def test_a_dead_process_slot_is_skipped(tmp_path: Path) -> None:
    code = (
        "from ray_wandb_nodes._hang.beacon import Beacon\n"
        f"b = Beacon({str(tmp_path)!r}, 5); b.step(); b.close(remove=False)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert len(list(tmp_path.glob("*.slot"))) == 1
    assert read_slots(tmp_path) == []


def test_another_process_reads_while_the_rank_writes_and_sees_its_counts_in_order(tmp_path: Path) -> None:
    # The writer stamps steps and reports in lockstep: every slot read has steps == reports or
    # steps one ahead, and counts never go back. (A write caught half-way is refused by the
    # sequence check: test_a_write_under_way_is_never_returned.)
    code = textwrap.dedent(
        f"""
        import sys
        from ray_wandb_nodes._hang.beacon import Beacon
        b = Beacon({str(tmp_path)!r}, 1)
        print("ready", flush=True)
        for _ in range(2_000_000):  # a few seconds of writes, then idle until the test ends it
            b.step(); b.report()
        sys.stdin.read()
        """
    )
    with python_child(code):
        seen: list[int] = []
        distinct = reads = 0
        deadline = time.monotonic() + 30  # a loaded machine may not run the writer for a while
        while (reads < 3000 or distinct < 3) and time.monotonic() < deadline:
            reads += 1
            for slot in read_slots(tmp_path):  # none while a write is under way
                assert slot.steps - slot.reports in (0, 1)
                distinct += not seen or slot.steps != seen[-1]
                seen.append(slot.steps)
        assert seen == sorted(seen) and len(set(seen)) >= 3, seen[-5:]


def test_bad_rank_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rank must be an int >= 0, got -1"):
        Beacon(tmp_path, -1)


def test_default_root_is_writable() -> None:
    root = default_root()
    assert root.is_dir() and os.access(root, os.W_OK)
    if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK):
        assert root == Path("/dev/shm")


def test_the_optimizer_step_hook_counts_every_optimizer_step(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    beacon = Beacon(tmp_path, 0)
    remove = install_step_hook(beacon)
    assert remove is not None
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    for _ in range(3):
        param.grad = torch.ones(2)
        opt.step()
    assert read_slots(tmp_path)[0].steps == 3
    remove()
    opt.step()
    assert read_slots(tmp_path)[0].steps == 3
    beacon.close()


def test_an_armed_ranks_clock_starts_with_its_train_function(tmp_path: Path) -> None:
    import time as _time

    from ray_wandb_nodes._hang.beacon import Beacon, Phase, progress_of, read_slots

    beacon = Beacon(tmp_path, 2, Phase.STARTING)
    try:
        (slot,) = read_slots(tmp_path)
        assert slot.phase is Phase.STARTING and not slot.started
        created = slot.start_ns
        _time.sleep(0.05)
        beacon.start_clock()
        (slot,) = read_slots(tmp_path)
        assert slot.phase is Phase.RUNNING and not slot.started and slot.start_ns > created
        assert progress_of(slot, slot.start_ns + 10**9).age_s == 1.0
    finally:
        beacon.close()


def test_writes_that_are_no_progress_keep_the_thread_of_the_last_progress(tmp_path: Path) -> None:
    from ray_wandb_nodes._hang.beacon import Beacon, read_slots

    beacon = Beacon(tmp_path, 1)
    try:
        worker = threading.Thread(target=beacon.report, name="TrainingThread(f)")
        worker.start()
        worker.join()
        beacon.set_dump_signal(12)  # from another thread (the actor's): no progress
        beacon.start_clock()
        (slot,) = read_slots(tmp_path)
        assert slot.thread_ident == worker.ident and slot.dump_signal == 12
    finally:
        beacon.close()


# The cadence ("auto"'s), from tables on a controlled clock ------------------------------------
class Clock:
    """A monotonic clock in ns that the test moves (the beacon's and the reader's)."""

    def __init__(self) -> None:
        self.ns = 100 * CADENCE_BUCKET_NS + 7 * 10**9  # a few seconds into a bucket, as any time is

    def __call__(self) -> int:
        return self.ns

    def wait(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


def cadence_read(directory: Path, clock: Clock) -> float | None:
    """The rank's cadence as its node reads it: the slot's file, at the clock's now."""
    [slot] = read_slots(directory)
    return progress_of(slot, clock()).slowest_interval_s


def steps(beacon: Beacon, clock: Clock, every_s: float, count: int) -> None:
    for _ in range(count):
        clock.wait(every_s)
        beacon.step()


def test_the_cadence_is_the_slowest_interval_of_the_last_hour_and_a_stall_under_the_limit_is_forgotten(
    tmp_path: Path,
) -> None:
    """A one-off 90 s storage stall (under the 120 s floor, so no hang) raises the cadence for as
    long as the window holds its bucket (50 to 60 minutes), then the job's own second is back."""
    clock = Clock()
    beacon = Beacon(tmp_path, 0, hang_limit_s=auto_running_limit_s, clock=clock)
    try:
        assert cadence_read(tmp_path, clock) is None  # no interval yet
        steps(beacon, clock, 1.0, 1)
        assert cadence_read(tmp_path, clock) is None  # the start to the first step is no cadence
        steps(beacon, clock, 1.0, 30)
        assert cadence_read(tmp_path, clock) == 1.0
        steps(beacon, clock, 90.0, 1)  # the stall
        stalled = clock()
        assert cadence_read(tmp_path, clock) == 90.0
        # The window: the stall's bucket and the five after it, so 50 to 60 minutes after it.
        for minutes, expected in ((10, 90.0), (30, 90.0), (49, 90.0), (61, 1.0), (180, 1.0)):
            while clock() < stalled + minutes * 60 * 10**9:
                steps(beacon, clock, 1.0, 1)
            assert cadence_read(tmp_path, clock) == expected, f"{minutes} min after the stall"
    finally:
        beacon.close()


# (case, step interval s, slow interval s, steps between two slow ones, hours, cadence expected once seen)
RECURRING = [
    ("a 60 s data refill every 100 steps of 1 s", 1.0, 60.0, 100, 3, 60.0),
    ("a 100 s shard download every 40 minutes of 2 s steps", 2.0, 100.0, 1200, 4, 100.0),
    ("a 30 s sync every 1,000 steps of 3 s", 3.0, 30.0, 1000, 4, 30.0),
]


@pytest.mark.parametrize(
    ("every_s", "slow_s", "period", "hours", "expected"), [c[1:] for c in RECURRING], ids=[c[0] for c in RECURRING]
)
def test_a_slow_interval_that_recurs_within_the_window_stays_the_cadence(
    tmp_path: Path, every_s: float, slow_s: float, period: int, hours: int, expected: float
) -> None:
    clock = Clock()
    beacon = Beacon(tmp_path, 0, hang_limit_s=auto_running_limit_s, clock=clock)
    try:
        beacon.step()
        seen: list[float | None] = []
        end = clock() + hours * 3600 * 10**9
        step = 0
        while clock() < end:
            step += 1
            clock.wait(slow_s if step % period == 0 else every_s)
            beacon.step()
            if step >= period and step % 50 == 0:  # once the first slow one came: read now and then
                seen.append(cadence_read(tmp_path, clock))
        assert seen and set(seen) == {expected}, sorted(set(seen), key=str)
    finally:
        beacon.close()


# (case, cadence before s, the long interval s, left out)
HANGS = [
    ("a 5-minute stall against the 120 s floor: a hang, left out", 1.0, 300.0, True),
    ("121 s against the floor: a hang, left out", 1.0, 121.0, True),
    ("119 s against the floor: kept", 1.0, 119.0, False),
    ("250 s where the cadence is 60 s (limit 300 s): kept", 60.0, 250.0, False),
    ("400 s where the cadence is 60 s (limit 300 s): a hang, left out", 60.0, 400.0, True),
]


@pytest.mark.parametrize(("cadence_s", "long_s", "left_out"), [c[1:] for c in HANGS], ids=[c[0] for c in HANGS])
def test_an_interval_past_the_running_limit_in_force_was_a_hang_and_is_left_out(
    tmp_path: Path, cadence_s: float, long_s: float, left_out: bool
) -> None:
    clock = Clock()
    beacon = Beacon(tmp_path, 0, hang_limit_s=auto_running_limit_s, clock=clock)
    try:
        beacon.step()
        steps(beacon, clock, cadence_s, 3)
        assert cadence_read(tmp_path, clock) == cadence_s
        steps(beacon, clock, long_s, 1)  # the hang resolves (or the slow interval ends)
        steps(beacon, clock, cadence_s, 3)
        assert cadence_read(tmp_path, clock) == (cadence_s if left_out else long_s)
    finally:
        beacon.close()


def test_without_a_limit_every_interval_counts(tmp_path: Path) -> None:
    clock = Clock()
    beacon = Beacon(tmp_path, 0, clock=clock)  # a beacon of its own (no policy): nothing left out
    try:
        beacon.step()
        steps(beacon, clock, 1.0, 2)
        steps(beacon, clock, 3600.0, 1)
        assert cadence_read(tmp_path, clock) == 3600.0
    finally:
        beacon.close()


def test_long_phases_and_reports_barrier_are_no_cadence_the_work_before_them_is(tmp_path: Path) -> None:
    """A loop without optimizer steps (XGBoost's: one report a round) has a cadence: the round's
    work up to its report. The time inside a long phase or Ray's report barrier has none."""
    clock = Clock()
    beacon = Beacon(tmp_path, 0, hang_limit_s=auto_running_limit_s, clock=clock)

    def report(work_s: float, barrier_s: float) -> None:
        clock.wait(work_s)
        beacon.phase(Phase.IN_REPORT)
        clock.wait(barrier_s)
        beacon.phase(Phase.RUNNING)
        beacon.report()

    try:
        report(5.0, 0.1)  # the first: no interval before it
        assert cadence_read(tmp_path, clock) is None
        report(30.0, 0.1)
        report(20.0, 100.0)  # a long wait in the barrier (a peer's slow round: its cadence)
        assert cadence_read(tmp_path, clock) == 30.0
        clock.wait(10.0)
        with beacon.in_phase(Phase.CHECKPOINTING):  # 10 s of work before the save: an interval
            clock.wait(1000.0)
        assert cadence_read(tmp_path, clock) == 30.0
        report(40.0, 0.1)  # after a phase, the first interval runs from its end: not counted
        report(45.0, 0.1)
        assert cadence_read(tmp_path, clock) == 45.0
    finally:
        beacon.close()


# The slot's layout --------------------------------------------------------------------------
def test_the_extension_region_is_another_writers_and_comes_back_raw_with_the_slot(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 0)
    try:
        assert (SLOT_SIZE, EXTENSION_AT, VERSION) == (512, 256, 2)
        [slot] = read_slots(tmp_path)
        assert slot.extension == b"\0" * 256
        region = beacon.extension
        assert len(region) == 256
        struct.pack_into("<QQ", region, 0, 2, 0xABCD)  # its own counter (even: written) and a value
        beacon.step()
        [slot] = read_slots(tmp_path)
        assert struct.unpack_from("<QQ", slot.extension) == (2, 0xABCD) and slot.steps == 1
        # A write of the extension's under way: the slot is read all the same, without the region.
        struct.pack_into("<Q", region, 0, 3)
        beacon.step()
        [slot] = read_slots(tmp_path)
        assert slot.extension == b"" and slot.steps == 2
        # Hang detection never writes there.
        struct.pack_into("<Q", region, 0, 4)
        for _ in range(3):
            beacon.step()
            beacon.report()
            beacon.phase(Phase.EVALUATING)
        assert struct.unpack_from("<QQ", read_slots(tmp_path)[0].extension) == (4, 0xABCD)
        region.release()
    finally:
        beacon.close()


def test_the_training_thread_is_the_one_that_stamped_last_and_any_before_its_first_stamp(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 0, Phase.STARTING)  # created by the worker's set-up thread
    try:
        beacon.start_clock()
        answers: dict[str, bool] = {}

        def ask(name: str) -> None:
            answers[name] = beacon.on_training_thread()

        before = threading.Thread(target=ask, args=("before",))
        before.start()
        before.join()
        stamped, done = threading.Event(), threading.Event()

        def train() -> None:
            beacon.report()
            ask("training")
            stamped.set()
            done.wait(10)  # alive while the others ask (a dead thread's ident is given again)

        training = threading.Thread(target=train)
        training.start()
        try:
            assert stamped.wait(10)
            other = threading.Thread(target=ask, args=("other",))
            other.start()
            other.join()
            assert answers == {"before": True, "training": True, "other": False}
            assert not beacon.on_training_thread()  # the set-up thread, once the training thread stamped
        finally:
            done.set()
            training.join()
    finally:
        beacon.close()


def test_a_report_before_the_first_step_leaves_the_first_steps_allowance(tmp_path: Path) -> None:
    """Ray's report barrier entered before any progress (a report before the first step, a
    rank waiting there for a peer that still loads its model) is no progress: the rank keeps the
    first step's limit (3 x) and its time counts from the train function's start."""
    clock = Clock()
    beacon = Beacon(tmp_path, 0, Phase.STARTING, clock=clock)
    fixed = parse_hang_timeout(10)
    try:
        beacon.start_clock()
        started = read_slots(tmp_path)[0].start_ns
        clock.wait(5.0)
        beacon.phase(Phase.IN_REPORT)
        clock.wait(20.0)  # in the barrier, past the running limit (10 s), within the first step's (30 s)
        [slot] = read_slots(tmp_path)
        progress = progress_of(slot, clock())
        assert slot.phase is Phase.IN_REPORT and not slot.started and slot.start_ns == started
        assert progress.age_s == 25.0
        assert limit_s(fixed, cadence_s=None, started=progress.started, phase=progress.phase) == 30.0
        beacon.phase(Phase.RUNNING)
        assert not read_slots(tmp_path)[0].started  # leaving it is no progress either
        beacon.report()  # the report returned: progress
        [slot] = read_slots(tmp_path)
        assert slot.started and slot.last_progress_ns == clock()
    finally:
        beacon.close()
