"""What each attempt's last hang said of who stopped and who waits, kept for the failure rule
(``_failure.stuck``): where that attempt then fails, its ranks' errors are judged with it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._failure import HangView
from .._hang import HangNotice

VIEWS_KEPT = 8  # attempts whose last hang's judgement is kept for their failure


@dataclass
class AttemptViews:
    """The last few attempts' last hang's view, by attempt key (the oldest dropped first)."""

    views: dict[str, HangView] = field(default_factory=dict)

    def view(self, key: str | None) -> HangView | None:
        """What the last hang of the attempt ``key`` said (None: none)."""
        return self.views.get(key) if key is not None else None

    def keep(self, key: str, notice: HangNotice) -> None:
        """``notice`` the last hang of the attempt ``key``."""
        self.views[key] = hang_view(notice)
        while len(self.views) > VIEWS_KEPT:
            self.views.pop(next(iter(self.views)))

    def drop(self, key: str) -> None:
        """The attempt ``key`` made progress again: a later failure is not its hang's."""
        self.views.pop(key, None)


def hang_view(notice: HangNotice) -> HangView:
    """A hang's judgement as the failure rule takes it: who stopped, where, and who waits in which collective."""
    rows = {r.rank: r for r in notice.rows}
    waits = [r for r in notice.rows if r.state == "waits" and r.collective and r.collective != "report"]
    first = waits[0] if waits else None
    return HangView(
        stopped=notice.stopped,
        where={rank: r.where for rank, r in rows.items() if rank in notice.stopped and r.where},
        steps={rank: r.last_step for rank, r in rows.items()},
        collective=first.collective if first else "",
        seq=first.seq if first else None,
        group=first.group if first else "",
        episode=notice.episode,
    )
