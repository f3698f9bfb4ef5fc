"""A node's watch on its ranks' ends (``_failure.deaths.NodeDeaths``), on real processes and files:
a rank's record outlives its files, a process killed is found gone between two looks, an attempt
no longer watched is forgotten after a while, and the facts answer only the ranks asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ray_wandb_nodes._failure import NodeDeaths, RankRecorder, RecordKind
from ray_wandb_nodes._failure.deaths import KEEP_S
from ray_wandb_nodes._hang import run_dir

KEY = "run-1.a1.0badcafe"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raised_here(folder: Path, rank: int) -> None:
    """A rank in this process whose train function raised (its record, as the hook writes it)."""
    recorder = RankRecorder(folder, rank)
    assert recorder.present()
    try:
        raise ValueError("bad shard 17")
    except ValueError as e:
        assert recorder.raised(e)


def test_a_raise_is_kept_after_its_files_go_and_a_kill_is_found_between_two_looks(tmp_path: Path) -> None:
    folder = run_dir(KEY, tmp_path)
    folder.mkdir(parents=True)
    raised_here(folder, rank=0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        RankRecorder(folder, 1).path(".rank", child.pid).touch()  # rank 1's mark, as its set-up writes it
        deaths = NodeDeaths(tmp_path, read_oom_kills=lambda: 3)
        deaths.look({KEY: (0, 1)})
        assert deaths.facts(KEY, (0, 1)).gone == ()  # both alive

        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for path in folder.iterdir():  # the node removes a dead process's files (``_hang.remove_dead``)
            path.unlink()
        facts = deaths.facts(KEY, (0, 1))
        assert [(r.rank, r.kind, r.error_type, r.message) for r in facts.records] == [
            (0, RecordKind.RAISED, "ValueError", "bad shard 17")
        ]
        assert [(g.rank, g.pid, g.oom_kills) for g in facts.gone] == [(1, child.pid, 0)]
        gone = facts.gone[0]
        assert 0 < gone.alive_ns < gone.gone_ns  # its window: between the two looks
        assert facts.oom_kills == 0  # the cgroup's count did not move since the watch began
        # Asked of one rank, the facts are that rank's alone.
        assert deaths.facts(KEY, (1,)).records == () and len(deaths.facts(KEY, (1,)).gone) == 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_an_attempt_no_longer_watched_is_kept_a_while_then_forgotten(tmp_path: Path) -> None:
    folder = run_dir(KEY, tmp_path)
    folder.mkdir(parents=True)
    raised_here(folder, rank=2)
    clock = Clock()
    deaths = NodeDeaths(tmp_path, read_oom_kills=lambda: None, clock=clock)
    deaths.look({KEY: (2,)})
    deaths.look({})  # the next attempt started: this one's facts may still be asked
    clock.now += KEEP_S - 1
    deaths.look({})
    assert deaths.keys() == {KEY} and deaths.facts(KEY, (2,)).records[0].message == "bad shard 17"
    clock.now += 2
    deaths.look({})
    assert deaths.keys() == set()


def test_a_rank_of_another_node_in_a_shared_folder_is_not_this_node_s(tmp_path: Path) -> None:
    """Nodes that share a host's /dev/shm see each other's files: a node answers for its ranks."""
    folder = run_dir(KEY, tmp_path)
    folder.mkdir(parents=True)
    raised_here(folder, rank=5)
    deaths = NodeDeaths(tmp_path, read_oom_kills=lambda: None)
    deaths.look({KEY: (0, 1)})
    assert deaths.facts(KEY, (0, 1)).records == ()
