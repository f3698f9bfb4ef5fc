"""The node's evidence of a death without Python: its memory cgroup's OOM-kill count (cgroup v1
and v2, read where the files are), and whether a rank's process is gone (a zombie counts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ray_wandb_nodes._failure import DeathWatch, oom_kills, process_gone
from ray_wandb_nodes._failure.node import cgroup_memory_files, parse_oom_kills

V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
V1_PROC = "12:pids:/\n4:memory:/process_api/165ba6\n3:cpuset:/\n1:name=systemd:/\n0::/\n"
V2_PROC = "0::/system.slice/ray-worker.service\n"


def test_the_oom_kill_count_of_either_cgroup_version() -> None:
    assert parse_oom_kills(V2_EVENTS) == 2
    assert parse_oom_kills(V1_OOM_CONTROL) == 5
    assert parse_oom_kills("low 0\nhigh 0\n") is None  # a kernel before 4.13 counts none


def test_where_each_cgroup_version_keeps_it(tmp_path: Path) -> None:
    assert cgroup_memory_files(V2_PROC, tmp_path)[:2] == [
        tmp_path / "system.slice/ray-worker.service/memory.events", tmp_path / "memory.events"]  # fmt: skip
    assert cgroup_memory_files(V1_PROC, tmp_path)[:2] == [
        tmp_path / "memory/process_api/165ba6/memory.oom_control", tmp_path / "memory/memory.oom_control"]  # fmt: skip


def test_inside_a_container_the_root_file_is_the_container_s(tmp_path: Path) -> None:
    # The path /proc shows is the host's; inside the container's namespace only the root exists.
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.oom_control").write_text(V1_OOM_CONTROL)
    found = [p for p in cgroup_memory_files(V1_PROC, tmp_path) if p.exists()]
    assert found == [tmp_path / "memory" / "memory.oom_control"]


def test_this_machine_s_count_is_read_or_said_unknown() -> None:
    count = oom_kills()
    assert count is None or count >= 0
    if Path("/sys/fs/cgroup/memory/memory.oom_control").exists() or Path("/sys/fs/cgroup/memory.events").exists():
        assert count is not None


def test_a_process_is_gone_once_dead_even_before_it_is_reaped() -> None:
    assert not process_gone(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not process_gone(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(500):  # a zombie until waited for
            if process_gone(child.pid):
                break
            os.sched_yield()
        assert process_gone(child.pid)
    finally:
        child.kill()
        child.wait()
    assert process_gone(child.pid)


def test_the_watch_keeps_each_death_s_window() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watch = DeathWatch()
    try:
        assert watch.look([(5, child.pid)], now_ns=100) == []
        child.kill()
        child.wait()
        [gone] = watch.look([(5, child.pid)], now_ns=250)
    finally:
        child.kill()
    assert (gone.rank, gone.alive_ns, gone.gone_ns) == (5, 100, 250)
    assert watch.look([(5, child.pid)], now_ns=400) == []  # found once
    assert watch.gone() == [gone]


def test_each_death_comes_with_the_oom_kills_counted_as_it_happened(tmp_path: Path) -> None:
    """Where a rank's own cgroup cannot be read (none under ``tmp_path``), the node's count stands in."""
    counts = iter([4, 4, 5, 5, 6])  # at the start, then a read a look, then when asked
    script = "import time; print('ready', flush=True); time.sleep(60)"
    children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE) for _ in range(2)]
    watch = DeathWatch(read_oom_kills=lambda: next(counts), cgroup_root=tmp_path)
    try:
        for child in children:  # a Python running, not one still starting (its RSS is then a few pages)
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        watch.look([(0, children[0].pid), (1, children[1].pid)], now_ns=10)  # count 4
        children[0].kill()
        children[0].wait()
        [first] = watch.look([(0, children[0].pid), (1, children[1].pid)], now_ns=20)  # count 5: one as it died
        children[1].kill()
        children[1].wait()
        [second] = watch.look([(1, children[1].pid)], now_ns=30)  # count 5: none since its last look alive
    finally:
        for child in children:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
    assert (first.rank, first.oom_kills, second.rank, second.oom_kills) == (0, 1, 1, 0)
    assert first.cgroup is None and first.rss is not None and first.rss > 1 << 20  # a Python's RSS, sampled alive
    assert watch.oom_kills_since_start() == 2
    unknown = DeathWatch(read_oom_kills=lambda: None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    [gone] = unknown.look([(2, child.pid)], now_ns=5)
    assert gone.oom_kills is None and gone.alive_ns == 0


def test_a_node_s_facts_when_asked(tmp_path: Path) -> None:
    from ray_wandb_nodes._failure import RankRecorder, node_facts

    RankRecorder(tmp_path, 4).raised(ValueError("bad shard 17"))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    counts = iter([7, 8, 9])
    facts = node_facts(tmp_path, DeathWatch(read_oom_kills=lambda: next(counts)), [(5, child.pid)], 81.0)
    assert [(r.rank, r.message) for r in facts.records] == [(4, "bad shard 17")]
    assert [g.rank for g in facts.gone] == [5]
    assert (facts.oom_kills, facts.memory_percent) == (2, 81.0)
