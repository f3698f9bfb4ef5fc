"""The ``ranks`` table and the slow-rank history keys (pure): their columns, and their rows from
the latest attribution of every rank's step (``_steps``) and the rule's states.

A row is one rank: where it runs, how many steps it has taken, and its step taken apart (means
per step over the last window judged, in milliseconds on its own clock): input, compute (forward
and backward), exposed communication wait, optimizer, the rest, and its lateness against the
median rank. A part the rank does not measure is empty, never zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._steps import Attribution, RankWindow
from .rank_rule import RankPlace, RankState

RANK_COLUMNS = [
    "rank",
    "node",
    "gpu",
    "steps",
    "step_ms",
    "input_ms",
    "compute_ms",
    "comm_wait_ms",
    "optimizer_ms",
    "other_ms",
    "lateness_ms",
    "state",
]
TABLE_CAP = 512  # rows; past it the slow ranks and the latest, and one row counting the rest
LATENESS_KEY = "ranks/lateness_ms"  # the slowest rank's lateness against the median rank
INPUT_KEY = "ranks/input_wait_ms"  # the largest input wait of a rank, a step
SLOW_KEY = "ranks/slow"  # how many ranks the rule holds slow


def rank_rows(
    ranks: Iterable[int],
    attribution: Attribution | None,
    places: Mapping[int, RankPlace],
    state_of: Callable[[int], RankState],
) -> list[list[Any]]:
    """The ``ranks`` table of ``ranks`` (every rank of the job, judged or not), by rank; past
    ``TABLE_CAP`` rows, the slow ranks and the latest ones, then one row counting the others."""
    windows = {w.rank: w for w in attribution.windows} if attribution is not None else {}
    lateness = attribution.lateness_s if attribution is not None else {}
    ordered = sorted(set(ranks))
    if len(ordered) > TABLE_CAP:
        keep = sorted(ordered, key=lambda r: (state_of(r) is not RankState.SLOW, -(lateness.get(r) or 0.0), r))
        shown = sorted(keep[: TABLE_CAP - 1])
    else:
        shown = ordered
    rows = [rank_row(r, windows.get(r), lateness.get(r), places.get(r), state_of(r)) for r in shown]
    if len(shown) < len(ordered):
        rows.append([f"({len(ordered) - len(shown)} more ranks, none slow)", *[None] * (len(RANK_COLUMNS) - 1)])
    return rows


def rank_row(
    rank: int, window: RankWindow | None, lateness: float | None, place: RankPlace | None, state: RankState
) -> list[Any]:
    """One rank's row (``RANK_COLUMNS``)."""
    w = window
    return [
        rank,
        place.node if place is not None else None,
        place.gpu if place is not None else None,
        w.last_step if w is not None else None,
        _ms(w.step_s if w else None),
        _ms(w.input_s if w else None),
        _ms(w.compute_s if w else None),
        _ms(w.wait_s if w else None),
        _ms(w.optimizer_s if w else None),
        _ms(w.other_s if w else None),
        _ms(lateness),
        state.value,
    ]


def rank_history(attribution: Attribution | None, slow: int) -> dict[str, float]:
    """The history keys of one judgement: the slowest rank's lateness, the largest input wait
    (each where measured) and the count of slow ranks."""
    out: dict[str, float] = {SLOW_KEY: float(slow)}
    if attribution is None or attribution.basis is None:
        return out
    late = [v for v in attribution.lateness_s.values() if v is not None]
    if late:
        out[LATENESS_KEY] = round(max(0.0, max(late)) * 1e3, 3)
    inputs = [w.input_s for w in attribution.windows if w.input_s is not None]
    if inputs:
        out[INPUT_KEY] = round(max(inputs) * 1e3, 3)
    return out


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1e3, 2) if seconds is not None else None
