"""A failed attempt as the driver side saw it (:class:`FailedAttempt`): what Ray's controller saw
on the poll it decided on, where each rank ran, what Ray decided and the attempt's folder on each
node. It crosses from the Train controller's hooks to the fleet thread (in a command), and from a
Train run inside a Tune trial to the trial's run (through the hand-off, as JSON); a Tune function
trial's error makes one too. The fleet thread asks the nodes for their facts and decides there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .facts import RayPoll, RayRankError
from .table import RankPlace


@dataclass(frozen=True)
class FailedAttempt:
    """One failed attempt of a run (``attempt`` 1: the first)."""

    attempt: int
    retrying: bool  # Ray's failure policy retries (FailureConfig, or a Tune trial's max_failures)
    max_failures: int  # -1: without limit
    poll: RayPoll | None  # what Ray's controller saw of each rank (None: nothing, only the nodes' facts)
    places: tuple[tuple[str, RankPlace], ...]  # (node id, place) of every rank of the attempt
    key: str | None = None  # the attempt's folder on each node (``_hang.attempt_key``); None: no records
    # A Tune trial's own failure (its function raised, its actor died): left to the Train run inside
    # it where there is one (that run names its ranks' failures itself).
    trial: bool = False

    def by_node(self) -> dict[str, tuple[int, ...]]:
        """Each node's ranks (node id -> ranks)."""
        out: dict[str, list[int]] = {}
        for node_id, place in self.places:
            out.setdefault(node_id, []).append(place.rank)
        return {node_id: tuple(sorted(ranks)) for node_id, ranks in out.items()}

    def labels(self) -> dict[str, str]:
        """Each node's label (node id -> label)."""
        return {node_id: place.node for node_id, place in self.places}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FailedAttempt:
        data: Any = json.loads(text)
        poll = data.get("poll")
        return cls(
            attempt=int(data["attempt"]),
            retrying=bool(data["retrying"]),
            max_failures=int(data["max_failures"]),
            poll=_poll(poll) if isinstance(poll, dict) else None,
            places=tuple((str(n), _place(p)) for n, p in data.get("places", ())),
            key=str(data["key"]) if data.get("key") else None,
            trial=bool(data.get("trial", False)),
        )


FailureEvent = FailedAttempt | int  # a failed attempt, or the attempt that recovered after one (in order)


def _poll(data: dict[str, Any]) -> RayPoll:
    errors = tuple(
        RayRankError(**{**e, "causes": tuple(e.get("causes", ()))})
        for e in data.get("errors", ())
        if isinstance(e, dict)
    )
    return RayPoll(errors, _ints(data.get("running", ())), _ints(data.get("unanswered", ())))


def _place(data: dict[str, Any]) -> RankPlace:
    pid = data.get("pid")
    return RankPlace(int(data["rank"]), str(data["node"]), tuple(str(g) for g in data.get("gpus", ())),
                     int(pid) if pid is not None else None)  # fmt: skip


def _ints(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)
