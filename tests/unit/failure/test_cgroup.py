"""A killed rank's own memory cgroup (v1 and v2), found from its pid while it lives and read after
it died, and each rank's resident memory: on fake ``/proc`` and ``/sys/fs/cgroup`` trees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ray_wandb_nodes._failure import DeathWatch
from ray_wandb_nodes._failure.cgroup import GIB, PAGE_BYTES, CgroupMemory, find_cgroup, rss_bytes

MIB = 1024**2
UNLIMITED_V1 = "9223372036854771712"


@dataclass(frozen=True)
class Tree:
    """A cgroup layout: what ``/proc/<pid>/cgroup`` reads, and where its files lie (relative to the
    cgroup root), the limit set on ``limit_at`` (an ancestor's, as a pod's above its container)."""

    name: str
    proc_cgroup: str
    cgroup: str  # the process's cgroup directory
    limit_at: str  # the directory whose limit binds
    v2: bool


TREES = [
    Tree("v1", "4:memory:/process_api/abc/rwnh0-a\n0::/\n", "memory/process_api/abc/rwnh0-a",
         "memory/process_api/abc/rwnh0-a", False),
    Tree("v1, the pod's limit above the container's cgroup", "9:memory:/kubepods/pod1/ctr\n",
         "memory/kubepods/pod1/ctr", "memory/kubepods/pod1", False),
    Tree("v1 in a cgroup namespace", "4:memory:/\n", "memory", "memory", False),
    Tree("v2", "0::/kubepods.slice/pod1/ctr\n", "kubepods.slice/pod1/ctr", "kubepods.slice/pod1", True),
    Tree("v2 hybrid (unified)", "0::/user.slice/job\n", "unified/user.slice/job", "unified/user.slice/job", True),
]  # fmt: skip


class FakeHost:
    """A fake ``/proc`` and cgroup root under ``tmp_path``."""

    def __init__(self, root: Path, tree: Tree) -> None:
        self.proc, self.cgroups, self.tree = root / "proc", root / "cgroup", tree
        self.dir = self.cgroups / tree.cgroup
        self.dir.mkdir(parents=True, exist_ok=True)
        for level in [self.dir, *self.dir.parents]:
            if level == self.cgroups.parent:
                break
            limited = level == self.cgroups / tree.limit_at
            if tree.v2:
                (level / "memory.max").write_text(f"{3 * GIB}\n" if limited else "max\n")
            else:
                (level / "memory.limit_in_bytes").write_text(f"{3 * GIB}\n" if limited else UNLIMITED_V1 + "\n")
        self.kills(0)
        limit_dir = self.cgroups / tree.limit_at
        peak = "memory.peak" if tree.v2 else "memory.max_usage_in_bytes"
        (limit_dir / peak).write_text(f"{3 * GIB - MIB}\n")
        (limit_dir / ("memory.current" if tree.v2 else "memory.usage_in_bytes")).write_text(f"{GIB}\n")

    def kills(self, n: int) -> None:
        if self.tree.v2:
            (self.dir / "memory.events").write_text(f"low 0\nhigh 0\nmax 9\noom 1\noom_kill {n}\n")
        else:
            (self.dir / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n")

    def process(self, pid: int, rss_pages: int) -> None:
        folder = self.proc / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup").write_text(self.tree.proc_cgroup)
        (folder / "stat").write_text(f"{pid} (python) S 1 2 3\n")
        (folder / "statm").write_text(f"900000 {rss_pages} 1000 10 0 800000 0\n")

    def end(self, pid: int) -> None:
        for f in (self.proc / str(pid)).iterdir():
            f.unlink()
        (self.proc / str(pid)).rmdir()


@pytest.mark.parametrize("tree", TREES, ids=[t.name for t in TREES])
def test_a_rank_killed_in_its_own_cgroup_comes_with_its_kill_limit_peak_and_size(tmp_path: Path, tree: Tree) -> None:
    host = FakeHost(tmp_path, tree)
    host.process(101, 1000)
    host.process(102, 1000)
    node = iter([0] * 10)  # the node's count never moves: the rank's own cgroup decides
    watch = DeathWatch(read_oom_kills=lambda: next(node), cgroup_root=host.cgroups, proc=host.proc)
    assert watch.look([(0, 101), (1, 102)], now_ns=10) == []
    host.process(101, 5000)  # rank 0 grows
    assert watch.look([(0, 101), (1, 102)], now_ns=20) == []
    host.kills(1)
    host.end(101)  # gone: /proc/101 with it
    [gone] = watch.look([(0, 101), (1, 102)], now_ns=30)
    assert (gone.rank, gone.alive_ns, gone.gone_ns, gone.oom_kills) == (0, 20, 30, 1)
    assert gone.cgroup == CgroupMemory(3 * GIB, GIB, 3 * GIB - MIB, 2 if tree.v2 else 1)
    assert gone.rss == 5000 * PAGE_BYTES
    [m0, m1] = watch.memory()
    assert (m0.rank, m0.first, m0.last, m0.peak) == (0, 1000 * PAGE_BYTES, 5000 * PAGE_BYTES, 5000 * PAGE_BYTES)
    assert (m1.rank, m1.first, m1.peak) == (1, 1000 * PAGE_BYTES, 1000 * PAGE_BYTES)
    host.end(102)  # rank 1 ends later, no kill counted since its last look alive
    [later] = watch.look([(1, 102)], now_ns=40)
    assert (later.rank, later.oom_kills) == (1, 0)


def test_a_kill_before_the_last_look_alive_is_not_this_death_s(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, TREES[0])
    host.process(7, 100)
    watch = DeathWatch(read_oom_kills=lambda: None, cgroup_root=host.cgroups, proc=host.proc)
    host.kills(2)  # another process of the cgroup, killed before the rank was first seen
    watch.look([(3, 7)], now_ns=1)
    host.end(7)
    [gone] = watch.look([(3, 7)], now_ns=2)
    assert gone.oom_kills == 0 and gone.cgroup is not None


def test_without_its_own_cgroup_the_node_s_count_stands_in(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, TREES[0])
    host.process(7, 100)
    (host.proc / "7" / "cgroup").write_text("4:memory:/elsewhere\n")  # nothing readable under the root
    for f in host.dir.iterdir():
        f.unlink()
    counts = iter([5, 5, 6])
    watch = DeathWatch(read_oom_kills=lambda: next(counts), cgroup_root=tmp_path / "none", proc=host.proc)
    watch.look([(3, 7)], now_ns=1)
    host.end(7)
    [gone] = watch.look([(3, 7)], now_ns=2)
    assert (gone.oom_kills, gone.cgroup) == (1, None)


def test_no_cgroup_no_statm_no_evidence(tmp_path: Path) -> None:
    assert find_cgroup(1, tmp_path, tmp_path) is None
    assert rss_bytes(1, tmp_path) is None
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cgroup").write_text("0::/x\n")  # v2 with no memory controller: no memory.events
    assert find_cgroup(1, tmp_path / "cg", tmp_path) is None


def test_this_machine_s_own_cgroup_is_found_where_it_has_one() -> None:
    cgroup = find_cgroup()
    if cgroup is not None:
        assert (cgroup.oom_kills() or 0) >= 0
        figures = cgroup.figures()
        assert figures.limit is None or figures.limit > 0
    assert (rss_bytes(__import__("os").getpid()) or 0) > 1 << 20
