"""Memory kills as users meet them, from a table: the kernel's OOM killer in the killed rank's own
cgroup (with the figures), Ray's memory monitor (and which rank grew), a node that left with its
memory near full (a pod-level OOM), and the cases that must not say memory."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ray_wandb_nodes._failure import Gone, NodeFacts, RankPlace, RayPoll, RayRankError, choose, failure_notice
from ray_wandb_nodes._failure import rank_failures as table
from ray_wandb_nodes._failure.cgroup import GIB, CgroupMemory
from ray_wandb_nodes._failure.node import RankMemory
from ray_wandb_nodes._failure.words import POD_OOM_PERCENT

MIB = 1024**2
DIED = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file.")  # fmt: skip
# Ray 2.60's account, as the e2e run received it (tests/e2e/test_memory.py), its ids shortened.
RAY_OOM = (
    "2 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 198.18.0.12, ID: "
    "22a68c) was 2.88GB used / 3.00GB limit (0.960000)\nOOM kill reason: Memory usage 3092376453B exceeded "
    "threshold of 3060164198B (95.0% of 3221225472B limit)\nObject store memory usage: [- objects spillable: 0\n]\n"
    "Selected to kill: (Actor(baf89d): job ID=01000000, lease ID=0600, task name=NodeLogger.__init__, required "
    "resources={bundle_group_9c49: 0.001}, pid=101, actual memory used=0.08GB, worker ID=68f7)\nSelected to kill: "
    "(Actor(008ca9): job ID=01000000, lease ID=0c00, task name=RayTrainWorker.__init__, required resources={"
    "CPU_group_302e: 1}, pid=126, actual memory used=0.31GB, worker ID=051e)\nRefer to the documentation ..."
)
KERNEL = ("Rank 1 on node-x (GPU 0): out of memory: killed by the kernel's OOM killer (its memory cgroup counted "
          "1 OOM kill as it died; limit 3.0 GiB, peak 3.0 GiB; the rank used 2.7 GiB at its last sample)")  # fmt: skip
RAY = ("Rank 1 on node-x (GPU 0): out of memory: killed by Ray's memory monitor (node at 96% of 3.0 GB, threshold "
       "95.0%; the rank used 0.31 GB; Ray killed 2 workers at once, with it: NodeLogger (0.08 GB); rank 3 grew from "
       "0.3 GiB to 2.4 GiB; Ray killed rank 1, the newest worker)")  # fmt: skip
RAY_SELF = ("Rank 1 on node-x (GPU 0): out of memory: killed by Ray's memory monitor (node at 96% of 3.0 GB, "
            "threshold 95.0%; the rank used 0.31 GB; Ray killed 2 workers at once, with it: NodeLogger (0.08 GB); "
            "it grew from 0.3 GiB to 2.4 GiB)")  # fmt: skip
# Before Ray 2.56: one worker, the threshold as a fraction.
RAY_OLD = ("Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.5, ID: 3f2a) "
           "where the task (actor ID: 9c1, name=RayTrainWorker.__init__, pid=4242, memory used=2.40GB) was running "
           "was 2.86GB / 3.00GB (0.953), which exceeds the memory usage threshold of 0.95.")  # fmt: skip
RAY_OLD_LINE = ("Rank 1 on node-x (GPU 0): out of memory: killed by Ray's memory monitor (node at 95% of 3.0 GB, "
                "threshold 0.95)")  # fmt: skip
SIGNAL = (
    "Rank 1 on node-x (GPU 0) died with no Python exception (a signal: SIGKILL, the kernel's OOM killer or a crash)"
)
POD = ("Ranks 1,3 on node-x (GPU 0): its node left the cluster, likely out of memory (97% in use at its last "
       "sample: a pod-level OOM kill)")  # fmt: skip
LOST = "Ranks 1,3 on node-x (GPU 0): its node left the cluster"
LIMITED = CgroupMemory(3 * GIB, GIB, 3 * GIB - MIB)


def grown(rank: int) -> tuple[RankMemory, ...]:
    """Ranks 1 and 3 of the node, ``rank`` grown from 0.3 to 2.4 GiB, the other flat at 0.3 GiB."""
    small = int(0.3 * GIB)
    return tuple(RankMemory(r, 40 + r, small, int(2.4 * GIB) if r == rank else small,
                            int(2.4 * GIB) if r == rank else small) for r in (1, 3))  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    error: RayRankError | None
    facts: NodeFacts | None
    lost: bool
    first_line: str
    kind: str


def gone(kills: int | None, cgroup: CgroupMemory | None) -> tuple[Gone, ...]:
    return (Gone(1, 41, 10, 20, kills, cgroup, int(2.7 * GIB)),)


CASES = [
    Case("the kernel's OOM killer, counted in the rank's own cgroup",
         RayRankError(1, "ActorDiedError", DIED, died=True), NodeFacts((), gone(1, LIMITED), 0, 40.0), False,
         KERNEL, "oom"),
    Case("the kernel's OOM killer, seen by the node before Ray", None, NodeFacts((), gone(1, LIMITED), 0), False,
         KERNEL, "oom"),
    Case("a SIGKILL its cgroup did not count: no memory said", RayRankError(1, "ActorDiedError", DIED, died=True),
         NodeFacts((), gone(0, LIMITED), 0), False, SIGNAL, "signal"),
    Case("Ray's memory monitor killed the newest rank, another grew",
         RayRankError(1, "OutOfMemoryError", RAY_OOM, died=True), NodeFacts((), (), 0, ranks_memory=grown(3)), False,
         RAY, "oom"),
    Case("Ray's memory monitor killed the rank that grew", RayRankError(1, "OutOfMemoryError", RAY_OOM, died=True),
         NodeFacts((), (), 0, ranks_memory=grown(1)), False, RAY_SELF, "oom"),
    Case("Ray's memory monitor, before 2.56", RayRankError(1, "OutOfMemoryError", RAY_OLD, died=True),
         NodeFacts((), (), 0), False, RAY_OLD_LINE, "oom"),
    Case("a node that left at 97% of its memory: a pod-level OOM",
         RayRankError(1, "ActorDiedError", "The actor died because its node has died. Node Id: 3f2a", died=True),
         NodeFacts((), (), None, 97.0), True, POD, "lost"),
    Case("a node that left at 60%: no memory said",
         RayRankError(1, "ActorDiedError", "The actor died because its node has died. Node Id: 3f2a", died=True),
         NodeFacts((), (), None, 60.0), True, LOST, "lost"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_memory_kills_read_as_users_search_them(case: Case) -> None:
    poll = RayPoll((case.error,) if case.error else (), running=(0, 2, 3))
    places = [RankPlace(1, "node-x", ("0",), 41), RankPlace(3, "node-x", ("1",), 43), RankPlace(0, "node-y"),
              RankPlace(2, "node-y")]  # fmt: skip
    facts = {"node-x": case.facts} if case.facts else {}
    notice = failure_notice(choose(table(places, poll, facts, ["node-x"] if case.lost else [])))
    assert notice.text.splitlines()[0] == case.first_line
    assert notice.summary.kind == case.kind
    says_memory = "out of memory" in notice.text
    assert says_memory == (case.first_line not in (SIGNAL, LOST)), notice.text


def test_the_pod_oom_threshold_is_below_ray_s_memory_monitor_s() -> None:
    assert POD_OOM_PERCENT < 95.0  # Ray's default memory_usage_threshold: a node it would act on counts


def test_small_growth_names_no_rank() -> None:
    flat = tuple(RankMemory(r, 40 + r, GIB, GIB + 50 * MIB, GIB + 50 * MIB) for r in (1, 3))
    poll = RayPoll((RayRankError(1, "OutOfMemoryError", RAY_OOM, died=True),))
    facts = {"node-x": NodeFacts((), (), 0, ranks_memory=flat)}
    notice = failure_notice(choose(table([RankPlace(1, "node-x", ("0",), 41)], poll, facts)))
    assert "grew" not in notice.text and "out of memory: killed by Ray's memory monitor" in notice.title
