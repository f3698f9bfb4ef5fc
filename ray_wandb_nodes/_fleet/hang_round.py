"""A hang watch's evidence round (``hangs.py``): every rank read again with its evidence, all
nodes at once (``hang_nodes.py``), and the hang's notice where the fresh readings still show no
progress past the limit (``_hang/confirm.py``), with the verdict across ranks (``_hang/verdict.py``)
and the place it stopped at."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .._config.values import OnHang
from .._hang import (
    Counts,
    HangNotice,
    HangTimeout,
    Place,
    RankProgress,
    counts_of,
    describe_place,
    hang_notice,
    judge,
    place_of,
    still_hung,
)
from .hang_nodes import Ask, evidence

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .watched import WatchedRun


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic collector held off while a hang's evidence is unpickled, judged and
    written: 1,000 nodes' answers are millions of new objects, and each full collection they
    set off walks the whole heap (check() to the notice at 8,000 ranks: 3.1 s with it, 0.6 s
    without; ``bench/hang_evidence.py``). The evidence is freed (by reference counts) before
    the collector is back, so that its first collection does not walk it either."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Judged(NamedTuple):
    """An evidence round that confirmed its suspicion: the hang's notice and what the watch keeps."""

    notice: HangNotice
    sentence: str
    counts: dict[int, Counts]
    place: Place | None
    repeat_of: int | None  # the hang that ended the attempt before at the same place


@dataclass
class EvidenceRound:
    """One evidence round of a watch, as the watch stands when it starts: its settings, the
    number the hang would get, the reports at the attempt's last checkpoint (a place counts its
    reports since) and each place a hang ended an attempt at (``on_hang="restart"``)."""

    setting: HangTimeout
    on_hang: OnHang
    pg_timeout_s: float | None
    episode: int  # the hang's number, if it is one
    checkpoint_reports: int = 0
    restarted: Mapping[Place, int] = field(default_factory=dict)
    # Each rank's process as the round read it (the fresh reading where a node answered): what an
    # end may end. Set by run().
    judged: dict[int, RankProgress] = field(default_factory=dict)

    def run(
        self,
        target: WatchedRun,
        pool: LoggerPool,
        ranks: Mapping[int, tuple[RankProgress, str]],
        before: Mapping[int, Counts],
        ask: Ask,
    ) -> Judged | None:
        """Every rank read again with its evidence; the hang's notice when the fresh readings
        still show no progress past the limit, else None (the evidence dropped on return)."""
        started = time.monotonic()
        facts = evidence(target, pool, ranks, ask)
        self.judged = {f.progress.rank: f.progress for f in facts}
        fresh = [f.progress for f in facts if f.evidence is not None]
        unanswered = [f.progress for f in facts if f.evidence is None]
        if not still_hung(self.setting, fresh, unanswered, before, self.pg_timeout_s):
            return None
        silent = sorted({f.node for f in facts if f.evidence is None})
        taken = f"Evidence: {len(facts)} ranks, asked at once, in {time.monotonic() - started:.1f} s" + (
            f"; no answer from {', '.join(silent)}." if silent else "."
        )
        verdict = judge(facts)
        place = place_of(verdict, self.checkpoint_reports)
        repeat_of = self.restarted.get(place) if self.on_hang.ends_attempt and place is not None else None
        repeat = ""
        if repeat_of is not None and place is not None:
            repeat = (
                f"The attempt before this one stopped at the same place in hang {repeat_of}, which ended it: "
                f"{describe_place(place)}. This attempt is not ended: on_hang='restart' ends one attempt a place."
            )
        notice = hang_notice(verdict, facts, self.episode, self.on_hang, taken=taken, repeat=repeat)
        counts = {f.progress.rank: counts_of(f.progress) for f in facts}
        return Judged(notice, verdict.sentence, counts, place, repeat_of)
