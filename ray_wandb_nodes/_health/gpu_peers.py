"""The values each judged GPU is compared with, kept in order as they change (pure).

The idle rule compares a GPU's utilisation with the median of every other ranked GPU's, and the
slow rule a busy GPU's SM clock with the median of the other busy GPUs of its model. Gathered and
sorted again on every poll, those lists cost the whole fleet each time (8,000 GPUs at 1,000
nodes of 8), even when one node's summary came. :class:`Peers` keeps them instead, by node: each
node's values, by group (a model), and each group's values of all nodes in order. A node's new
values are one dict write; a group's sorted list takes the changes when it is next read, each
value by bisection (O(log n) to find, a memmove to shift), or with one C-level sort when so many
changed that sorting is cheaper. So a poll costs what changed, and the rules' medians
(``rule.median_without``) are those of the very values a rebuild would sort. :class:`GpuPeers`
holds the two the GPU rules read, and asks each rule's own function for a GPU's median.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Generic, TypeVar

from .gpu_idle import idle_verdict
from .gpu_slow import is_busy, others_median

if TYPE_CHECKING:
    from .gpu import Gpu

K = TypeVar("K", bound=Hashable)
Values = tuple[float, ...]
RESORT_SHARE = 8  # more than one value moved in this many: one sort beats bisecting each


class Peers(Generic[K]):
    """Each key's values in each group; each group's values of every key, in order (:meth:`ordered`).

    What it keeps across polls is flat tuples of floats, which Python's cyclic garbage collector
    stops tracking: the run's medians add nothing for it to walk (containers renewed every poll
    and kept to the next one made its full collections several times as frequent).
    """

    def __init__(self) -> None:
        self._groups: dict[str, dict[K, Values]] = {}
        self._sorted: dict[str, list[float]] = {}
        self._moves: dict[str, list[tuple[Values, Values]]] = {}  # (out, in), not in ``_sorted`` yet

    def set(self, group: str, key: K, values: Values) -> None:
        """``key``'s values in ``group`` now (empty: none there)."""
        members = self._groups.get(group)
        if members is None:
            members = self._groups[group] = {}
        was = members.get(key, ())
        if was == values:
            return
        if values:
            members[key] = values
        else:
            del members[key]
        moves = self._moves.get(group)
        if moves is None:
            self._moves[group] = [(was, values)]
        else:
            moves.append((was, values))

    def ordered(self, group: str) -> Sequence[float]:
        """``group``'s values, sorted (empty for a group without any)."""
        moves = self._moves.pop(group, None)
        if moves is None:
            return self._sorted.get(group, [])
        ordered = self._sorted.setdefault(group, [])
        moved = sum(len(out) + len(into) for out, into in moves)
        if moved * RESORT_SHARE > len(ordered) or not _bisect_in(ordered, moves):
            ordered = self._sorted[group] = sorted(chain.from_iterable(self._groups[group].values()))
        return ordered


class GpuPeers:
    """The utilisations of the run's alive judged GPUs that ranks hold (the idle rule's), and the
    SM clocks of its alive judged busy GPUs by model (the slow rule's), kept by node."""

    def __init__(self) -> None:
        self._utils: Peers[str] = Peers()
        self._clocks: Peers[str] = Peers()
        self._models: dict[str, frozenset[str]] = {}  # each node's models with busy clocks

    def node(self, node_id: str, alive: Sequence[Gpu]) -> None:
        """A node's alive judged GPUs as they are now (none: it adds nothing)."""
        self._utils.set("", node_id, tuple(g.util for g in alive if g.ranks and g.util is not None))
        clocks: dict[str, list[float]] = {}
        for gpu in alive:
            if gpu.busy_sm is not None and is_busy(gpu.busy_util, gpu.busy_sm):
                clocks.setdefault(gpu.model, []).append(float(gpu.busy_sm))
        had = self._models.get(node_id, frozenset())
        for model in had - clocks.keys():
            self._clocks.set(model, node_id, ())
        for model, values in clocks.items():
            self._clocks.set(model, node_id, tuple(values))
        if had != clocks.keys():
            self._models[node_id] = frozenset(clocks)

    def idle(self, gpus: Sequence[Gpu]) -> list[tuple[bool, float | None]]:
        """The idle rule's verdicts on GPUs that ranks hold, each with a utilisation (see ``gpu_idle``)."""
        ordered = self._utils.ordered("")
        return [idle_verdict(g.util, ordered) for g in gpus]  # type: ignore[arg-type]

    def slow_medians(self, gpus: Sequence[Gpu]) -> list[float | None]:
        """The others' median SM clocks the slow rule compares ``gpus`` with (see ``gpu_slow``)."""
        by_model = {model: self._clocks.ordered(model) for model in {g.model for g in gpus}}
        return [others_median(g.busy_util, g.busy_sm, by_model[g.model]) for g in gpus]


def _bisect_in(ordered: list[float], moves: list[tuple[Values, Values]]) -> bool:
    """Apply ``moves`` to ``ordered`` in place; False when a value to take out is not where it
    should be (a value that does not compare, as NaN: the caller sorts afresh)."""
    for out, into in moves:
        for value in out:
            i = bisect.bisect_left(ordered, value)
            if i == len(ordered) or not ordered[i] == value:
                return False
            del ordered[i]
        for value in into:
            bisect.insort(ordered, value)
    return True
