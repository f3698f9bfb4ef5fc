"""A hang watch's readings (``_fleet/hang_reads.py``) and the views it keeps for the failure rule
(``_fleet/hang_views.py``), each without the watch: a ping's readings aged by the ping's age, read
off each node's handle for the ranks placed there; the nodes table's ages; the last few attempts'
views, the oldest dropped first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray_wandb_nodes._fleet.hang_reads import Reading, aged, node_ages, read_progress
from ray_wandb_nodes._fleet.hang_views import VIEWS_KEPT, AttemptViews
from ray_wandb_nodes._hang import HangNotice, Phase, RankProgress

ATTEMPT = "run-1.a1.0badcafe"


def progress(rank: int, age: float, steps: int = 5) -> RankProgress:
    return RankProgress(rank, 100 + rank, 5, steps, True, age, Phase.RUNNING, age, 1.0, 12)


@dataclass
class Handle:
    progress: dict[str, tuple[RankProgress, ...]]
    progress_at: float


@dataclass
class Pool:
    handles: dict[str, Handle] = field(default_factory=dict)

    def get(self, node_id: str) -> Handle | None:
        return self.handles.get(node_id)


@dataclass
class Target:
    attempt: str | None = ATTEMPT
    covered_node: str | None = None


def test_ages_grow_with_the_pings_age() -> None:
    ranks = (progress(0, 3.0),)
    assert aged(ranks, 0.0) == ranks
    assert aged(ranks, 4.5)[0].age_s == 7.5 and aged(ranks, 4.5)[0].phase_age_s == 7.5
    assert Reading(progress(0, 3.0), "a", 4.5).now().age_s == 7.5


def test_readings_are_the_placed_ranks_of_the_attempt_as_old_as_their_ping() -> None:
    pool = Pool(
        {
            "a": Handle({ATTEMPT: (progress(0, 1.0), progress(1, 2.0)), "other": (progress(5, 0.0),)}, 7.0),
            "b": Handle({ATTEMPT: (progress(2, 0.5),)}, 9.0),
        }
    )
    placed = {"a": (0,), "b": (2,), "gone": (3,)}  # rank 1 is not the run's; node "gone" has no logger
    out: Any = read_progress(placed, Target(), pool, lambda: 10.0)  # type: ignore[arg-type]
    assert out == {0: Reading(progress(0, 1.0), "a", 3.0), 2: Reading(progress(2, 0.5), "b", 1.0)}
    now = {rank: r.now() for rank, r in out.items()}
    assert node_ages(out, now) == {"a": 4.0, "b": 1.5}
    assert read_progress(placed, Target(attempt=None), pool, lambda: 10.0) == {}  # type: ignore[arg-type]


def test_the_last_few_attempts_views_are_kept_and_a_resumed_one_dropped() -> None:
    views = AttemptViews()
    for i in range(VIEWS_KEPT + 2):
        views.keep(f"a{i}", HangNotice(i + 1, "hang", "", "ERROR", stopped=(i,)))
    assert views.view("a0") is None and views.view("a1") is None and views.view(None) is None
    kept = views.view(f"a{VIEWS_KEPT + 1}")
    assert kept is not None and kept.stopped == (VIEWS_KEPT + 1,) and kept.episode == VIEWS_KEPT + 2
    views.drop(f"a{VIEWS_KEPT + 1}")
    assert views.view(f"a{VIEWS_KEPT + 1}") is None and views.view("a2") is not None
