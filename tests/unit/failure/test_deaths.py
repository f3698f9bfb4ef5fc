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


def test_a_node_s_reads_remove_only_the_files_of_ends_its_death_watch_has_read(tmp_path: Path) -> None:
    """The node logger's order on every status ping (``NodeLogger._read_watched``): its death watch
    looks first, then the watch's read removes the files of those processes only. A rank that
    raised and died between two pings keeps its record, and its kill is found gone with it."""
    from ray_wandb_nodes._hang import NodeWatch

    folder = run_dir(KEY, tmp_path)
    folder.mkdir(parents=True)
    watch, deaths = NodeWatch(tmp_path), NodeDeaths(tmp_path, read_oom_kills=lambda: 0)
    watch.watch(KEY, (0, 1))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        RankRecorder(folder, 1).path(".rank", child.pid).touch()
        deaths.look(watch.watching())
        watch.read(deaths.ended)
        raised_here(folder, rank=0)  # rank 0 raises after the ping ...
        os.kill(child.pid, signal.SIGKILL)  # ... and rank 1 is killed, both before the next one
        child.wait()
        stale = RankRecorder(folder, 0).path(".failure.json", 999_999)  # a dead process never looked at
        stale.write_text(RankRecorder(folder, 0).path(".failure.json").read_text())
        assert set(deaths.ended(KEY)) == set()
        watch.read(deaths.ended)  # a read alone (no look first) removes nothing it has not read
        assert stale.exists() and any(folder.glob("rank-1.*"))
        deaths.look(watch.watching())
        watch.read(deaths.ended)
        facts = deaths.facts(KEY, (0, 1))
        assert [(g.rank, g.pid) for g in facts.gone] == [(0, 999_999), (1, child.pid)]
        assert not any(folder.glob(f"rank-1.{child.pid}.*")) and not stale.exists()  # their ends read: files go
        assert [r.rank for r in facts.records if r.kind is RecordKind.RAISED][:1] == [0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_rank_found_gone_without_a_record_has_its_last_words_read_once(tmp_path: Path) -> None:
    folder = run_dir(KEY, tmp_path)
    folder.mkdir(parents=True)
    said: list[int] = []

    def words(pid: int) -> str:
        said.append(pid)
        return "To avoid data inconsistency, we are taking the entire process down."

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        RankRecorder(folder, 3).path(".rank", child.pid).touch()
        deaths = NodeDeaths(tmp_path, read_oom_kills=lambda: None, last_words=words)
        deaths.look({KEY: (3,)})
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        deaths.look({KEY: (3,)})
        deaths.look({KEY: (3,)})
        facts = deaths.facts(KEY, (3,))
        ((rank, pid, told),) = facts.last_words
        assert said == [child.pid]
        assert (rank, pid, told.signal, told.lines) == (3, child.pid, "SIGABRT", (words(child.pid),))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
