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
    MAGIC,
    SLOT_SIZE,
    Beacon,
    Phase,
    default_root,
    install_step_hook,
    progress_of,
    read_slot,
    read_slots,
    slot_path,
)

REPO = Path(__file__).resolve().parents[2]


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
    beacon = Beacon(tmp_path, 0)
    beacon.step()
    time.sleep(0.05)
    beacon.step()
    beacon.report()
    with beacon.in_phase(Phase.CHECKPOINTING):
        assert read_slots(tmp_path)[0].phase is Phase.CHECKPOINTING
        time.sleep(0.2)  # a long phase is not the job's cadence
    beacon.step()
    beacon.set_dump_signal(12)
    [slot] = read_slots(tmp_path)
    assert (slot.steps, slot.reports, slot.phase, slot.dump_signal) == (3, 1, Phase.RUNNING, 12)
    # The slowest interval is the 50 ms between the two steps: neither the time before the first
    # step nor the checkpoint counts.
    assert 0.05 <= slot.max_interval_ns / 1e9 < 0.2
    now = time.monotonic_ns()
    progress = progress_of(slot, now)
    assert progress.started and 0 <= progress.age_s < 1.0
    assert progress.slowest_interval_s == pytest.approx(slot.max_interval_ns / 1e9)
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
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
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
    finally:
        proc.kill()
        proc.wait()


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
