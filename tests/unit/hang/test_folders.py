"""An attempt's folder on a node (``_hang/folders.py``): named for one attempt of one job, its dead
processes' files removed, the folder gone once nothing of it lives, and the janitor that never
takes a live job's folder; and every file in it bounded (the rank trims its flight recorder,
faulthandler's file holds one dump)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from ray_wandb_nodes._hang.beacon import Beacon, read_slots
from ray_wandb_nodes._hang.dumps import request_dump
from ray_wandb_nodes._hang.evidence import _write_python_evidence, arm, disarm
from ray_wandb_nodes._hang.flight import parse_flight_recorder, trim_dump
from ray_wandb_nodes._hang.folders import (
    LEASE,
    attempt_key,
    new_token,
    remove_dead,
    remove_if_dead,
    run_dir,
    sweep_stale,
    touch,
)
from ray_wandb_nodes._hang.slot import HEADER_AT
from ray_wandb_nodes._hang.stacks import parse_faulthandler
from tests.support.armed_process import running
from tests.support.hang_fixtures import capture, files_of, filled_ring, rank_process

_PROC_START_AT = HEADER_AT + 16  # magic I, version H, phase B, signal B, pid i, rank i: then the start time


def test_each_attempt_of_each_job_has_a_folder_of_its_own(tmp_path: Path) -> None:
    one, other = new_token(), new_token()
    assert one != other and len(one) == 8
    keys = {attempt_key("exp/run-1", n, token) for n in (1, 2) for token in (one, other)}
    assert len(keys) == 4  # two jobs of one run name and storage path, two attempts each
    key = attempt_key("exp/run-1", 2, one)
    assert key == f"exp_run-1.a2.{one}"
    assert run_dir(key, tmp_path) == tmp_path / f"ray_wandb_nodes-{os.getuid()}" / key
    assert len(attempt_key("r" * 500, 1, one)) < 120  # a file name, with a rank's names after it


def test_the_files_of_a_dead_process_go_and_a_live_ones_stay(tmp_path: Path) -> None:
    with rank_process(tmp_path, 0, armed=True) as dead, rank_process(tmp_path, 1, armed=True) as live:
        request_dump(next(s for s in read_slots(tmp_path) if s.rank == 0), timeout_s=10)  # its evidence file too
        assert len(files_of(tmp_path, dead.pid)) >= 4  # slot, stacks, FIFO, evidence, ack
        dead.kill()
        dead.wait()
        assert remove_dead(tmp_path, ranks={1}) == (0, 1)  # another node's rank: not this node's to remove
        assert files_of(tmp_path, dead.pid)
        assert remove_dead(tmp_path) == (1, 1)
        assert files_of(tmp_path, dead.pid) == [] and files_of(tmp_path, live.pid)
        assert [s.rank for s in read_slots(tmp_path)] == [1]


def test_a_pid_taken_by_a_later_process_is_told_apart_by_its_start_time(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 3)  # this process: alive
    try:
        assert remove_dead(tmp_path) == (0, 1)
        with open(beacon.path, "r+b") as f:  # as if an earlier process with this pid wrote it
            f.seek(_PROC_START_AT)
            f.write(struct.pack("<Q", 1))
        assert remove_dead(tmp_path) == (1, 0) and not beacon.path.exists()
    finally:
        beacon.close()


def test_an_attempts_folder_goes_once_nothing_of_it_lives(tmp_path: Path) -> None:
    folder = run_dir(attempt_key("run-1", 1, "00000001"), tmp_path)
    with rank_process(folder, 0, armed=True) as proc:
        touch(folder)
        assert remove_if_dead(folder) is False and (folder / LEASE).exists()
        proc.kill()
        proc.wait()
        assert remove_if_dead(folder) is True and not folder.exists()
    assert remove_if_dead(folder) is True  # gone already


def test_the_janitor_takes_only_folders_nobody_watched_whose_processes_are_dead(tmp_path: Path) -> None:
    base = run_dir("x", tmp_path).parent
    live_job, dead_job, watched, fresh, unwatched_live = (
        run_dir(attempt_key(name, 1, "0000000a"), tmp_path) for name in ("live", "dead", "watched", "fresh", "busy")
    )
    with rank_process(live_job, 0), rank_process(unwatched_live, 0):
        for folder in (dead_job, watched, fresh):
            with rank_process(folder, 0):
                pass  # its process is gone: only its files are left
        for folder in (live_job, dead_job, watched, fresh, unwatched_live):
            touch(folder)
        later = os.path.getmtime(fresh / LEASE) + 601  # ten minutes on: every lease stale but fresh's
        os.utime(fresh / LEASE, (later, later))  # its watcher is alive: it refreshed the lease
        assert sweep_stale(tmp_path, keep={watched.name}, now=later) == [dead_job.name]
        assert sorted(p.name for p in base.iterdir()) == sorted(
            p.name for p in (live_job, watched, fresh, unwatched_live)
        )
    # Their processes ended and nobody watches them: left over now.
    assert sweep_stale(tmp_path, keep={watched.name}, now=later) == sorted([live_job.name, unwatched_live.name])


def test_a_rank_that_disarms_leaves_no_file(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path, 5)
    armed = arm(tmp_path, 5, beacon, signum=0)
    request_dump(read_slots(tmp_path)[0], timeout_s=10)
    disarm(armed, beacon)
    beacon.close()
    assert list(tmp_path.iterdir()) == []


def test_the_rank_keeps_only_the_collectives_in_flight_and_a_bounded_tail(tmp_path: Path) -> None:
    """A full ring (2,000 collectives) in the evidence file was about 0.5 MB a rank on the node's
    shared memory; trimmed in the rank, a few kB, and the node reads the same collectives."""
    for record in capture("python"):
        text = filled_ring(record["dump_thread"], earlier=1995)["flight_recorder"]
        trimmed = trim_dump(text)
        full, kept = parse_flight_recorder(text), parse_flight_recorder(trimmed)
        assert kept.in_flight() == full.in_flight() and kept.groups == full.groups
        assert all(kept.last_seq(g.pg) == full.last_seq(g.pg) for g in full.groups)
        assert full.trimmed() == kept.trimmed()  # what crosses to the driver is unchanged
        assert len(trimmed) < 10_000 < len(text) / 20
    assert trim_dump("not json" * 20_000) == ("not json" * 20_000)[: 1 << 16]


def test_the_rank_writes_its_flight_recorder_trimmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = filled_ring(capture("python")[0]["dump_thread"], earlier=1995)["flight_recorder"]
    monkeypatch.setattr("ray_wandb_nodes._hang.evidence.dump_flight_recorder", lambda: full)
    path = tmp_path / "rank-0.1.evidence.json"
    _write_python_evidence(path, 7)
    data = json.loads(path.read_text())
    assert data["complete"] and len(data["flight_recorder"]) < 10_000 and path.stat().st_size < len(full) / 10
    assert parse_flight_recorder(data["flight_recorder"]).in_flight() == parse_flight_recorder(full).in_flight()


def test_faulthandlers_file_holds_one_dump_however_often_it_is_signalled(tmp_path: Path, gil_lib: str) -> None:
    # Its Python held off by a C call that keeps the GIL: faulthandler's dump, each time it is asked.
    with running(tmp_path, "gil", gil_lib) as (proc, slot, _):
        sizes = []
        for _ in range(3):
            evidence = request_dump(slot, timeout_s=10)
            assert evidence.native
            stacks = tmp_path / f"rank-0.{proc.pid}.stacks"
            sizes.append(stacks.stat().st_size)
            assert len(parse_faulthandler(stacks.read_text())) == 1
        assert max(sizes) - min(sizes) < max(sizes) / 2  # not growing a dump a signal
