"""A node's side of hang detection (``_hang/node.py``): the attempt folders it watches, read for
the ranks placed on it only, cleaned as its ranks' processes end, let go once the attempt is over;
and an end that ends only the processes it names, so a late one never reaches a later attempt's
ranks, another job's or a process that took a dead rank's pid."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ray_wandb_nodes._hang.beacon import read_slots
from ray_wandb_nodes._hang.ending import EndAnswer, RankProcess
from ray_wandb_nodes._hang.folders import LEASE, attempt_key, run_dir
from ray_wandb_nodes._hang.node import NodeWatch, end_ranks
from tests.support.hang_fixtures import files_of, rank_process
from tests.support.wait import wait_until

ONE, TWO = attempt_key("run-1", 1, "0000000b"), attempt_key("run-1", 2, "0000000b")


def test_a_watched_attempt_gives_the_ranks_placed_on_this_node_by_its_key(tmp_path: Path) -> None:
    watch = NodeWatch(tmp_path)
    folder = run_dir(ONE, tmp_path)
    with rank_process(folder, 0), rank_process(folder, 1), rank_process(folder, 2):
        assert watch.progress() == {}  # nothing watched: nothing read
        watch.watch(ONE, (0, 1))
        assert (folder / LEASE).exists()  # leased at once: the janitor never takes it
        [(key, ranks)] = watch.progress().items()
        assert key == ONE and [r.rank for r in ranks] == [0, 1]  # rank 2 is another node's (a shared /dev/shm)
        watch.watch(ONE, (2,))  # the placement changed (a replaced replica group)
        assert [r.rank for r in watch.progress()[ONE]] == [2]


def test_reading_a_watched_attempt_removes_its_ranks_dead_processes(tmp_path: Path) -> None:
    watch = NodeWatch(tmp_path)
    folder = run_dir(ONE, tmp_path)
    watch.watch(ONE, (0,))
    with rank_process(folder, 0, armed=True) as first, rank_process(folder, 1, armed=True) as others:
        first.kill()
        first.wait()
        others.kill()
        others.wait()
        with rank_process(folder, 0, armed=True) as second:  # rank 0's process, replaced
            assert [r.pid for r in watch.progress()[ONE]] == [second.pid]
            assert files_of(folder, first.pid) == []  # dead, and this node's
            assert files_of(folder, others.pid)  # dead, but another node's rank: not this node's to remove


def test_an_attempt_let_go_goes_once_its_last_process_has_ended(tmp_path: Path) -> None:
    watch = NodeWatch(tmp_path)
    dead, live = run_dir(ONE, tmp_path), run_dir(TWO, tmp_path)
    with rank_process(dead, 0):
        pass
    watch.watch(ONE, (0,))
    watch.watch(TWO, (0,))
    with rank_process(live, 0) as proc:
        watch.unwatch(ONE)
        assert not dead.exists()  # nothing of it lived: at once
        watch.unwatch(TWO)
        assert live.exists() and watch.watching() == {}  # its process ending: it waits for it
        proc.kill()
        proc.wait()
        wait_until(lambda: not live.exists(), 10, "the folder to go once its process ended")


def test_the_janitor_keeps_what_this_node_watches(tmp_path: Path) -> None:
    watch = NodeWatch(tmp_path)
    for key in (ONE, TWO):
        with rank_process(run_dir(key, tmp_path), 0):
            pass
        stale = time.time() - 3600
        os.utime(run_dir(key, tmp_path), (stale, stale))
    watch.watch(ONE, (0,))
    for path in (run_dir(ONE, tmp_path) / LEASE, run_dir(ONE, tmp_path)):  # stale too: kept, as watched here
        os.utime(path, (time.time() - 3600,) * 2)
    assert watch.janitor() == [TWO] and run_dir(ONE, tmp_path).exists()


def name(slot: object) -> RankProcess:
    return RankProcess(slot.rank, slot.pid, slot.proc_start)  # type: ignore[attr-defined]


def test_an_end_ends_the_processes_it_names_and_refuses_any_other(tmp_path: Path) -> None:
    one, two = run_dir(ONE, tmp_path), run_dir(TWO, tmp_path)
    with rank_process(one, 0) as judged:
        [slot] = read_slots(one)
        named = name(slot)
        judged.kill()  # the hung attempt ended (Ray restarted it) before the end came
        judged.wait()
    with rank_process(two, 0) as next_attempt, rank_process(one, 0) as same_folder:
        # Late: its attempt is over. Not the next attempt's rank 0, nor a new process in its folder.
        assert end_ranks(ONE, [named], "hang 1", tmp_path) == EndAnswer((), (0,))
        [now] = read_slots(two)
        # The next attempt's folder with the old process's name, or its pid with another start time.
        assert end_ranks(TWO, [named], "hang 1", tmp_path) == EndAnswer((), (0,))
        assert end_ranks(TWO, [named._replace(pid=now.pid)], "hang 1", tmp_path).ended == ()
        time.sleep(0.2)
        assert next_attempt.poll() is None and same_folder.poll() is None  # both live on
        # Named as judged: ended (no dump thread to raise in: killed at once).
        assert end_ranks(TWO, [name(now)], "hang 2", tmp_path, grace_s=0.1) == EndAnswer((0,), ())
        assert next_attempt.wait(timeout=10) == -9 and same_folder.poll() is None
