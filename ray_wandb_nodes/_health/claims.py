"""One slow rank, one alert (pure): the node and GPU alerts that the rank rule speaks for, held
back.

A rank the others wait for shows in the node rule too (its node's GPU utilisation or CPU apart
from the others') and in the GPU rules (its GPU slow, or idle while it waits for its input). The
rank rule names the rank, its cause and what it costs the job; so:

1. **The rank rule speaks for a node** while it holds a rank there slow or its latest judgement
   names one there (a slow episode under way); **for a GPU** likewise, for a rank on that GPU (or
   on a GPU of that node not known).
2. **A straggler alert of a node, or a slow- or idle-GPU alert, that the rank rule speaks for is
   not said, nor is the recovery that ends its episode**: the episode is the rank rule's. The
   ``nodes`` and ``gpus`` tables still show the node's and the GPU's state.
3. **Where the rank rule judges the run's ranks, such an alert waits for its next judgement**
   (at most :meth:`RankHealth.patience`): said then unless that judgement names a rank there. The
   rank rule sees a slow rank in its first windows, the node and GPU rules only after their window;
   the wait covers a rule that judges seldom (DDP's CUDA timers time one step in 211).

A node or GPU alert said while the rank rule named no rank there stands, and so does its
recovery. Node losses, lost GPUs and memory errors are causes of their own: never held.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from .alerts import Alert
from .kinds import EventKind
from .ranks import RankHealth

HELD = frozenset({EventKind.STRAGGLER, EventKind.RECOVERED, EventKind.SLOW_GPU, EventKind.IDLE_GPU})


@dataclass
class _Waiting:
    key: Hashable
    node_id: str
    alert: Alert
    judged: int  # the rank rule's judgements when it came: it waits for the next
    since: float


class ClaimHold:
    """The node and GPU alerts of one run, before they are said (see the module's docstring)."""

    def __init__(self) -> None:
        self._waiting: list[_Waiting] = []
        self._unsaid: set[Hashable] = set()  # episodes the rank rule spoke for: their recovery is unsaid too
        self.held = 0  # alerts left unsaid so far (a count, for tests and benchmarks)

    def admit(self, node_id: str, alert: Alert, now: float, ranks: RankHealth) -> list[tuple[str, Alert]]:
        """What to say now of ``alert`` of node ``node_id`` (``[]``: nothing now, or never)."""
        if alert.kind not in HELD:
            return [(node_id, alert)]
        key = _episode(node_id, alert)
        if alert.recovered or alert.kind is EventKind.RECOVERED:
            if key in self._unsaid:
                self._unsaid.discard(key)
                self.held += 1
                return []
            waiting = next((w for w in self._waiting if w.key == key), None)
            if waiting is not None:  # over before it was said: neither is
                self._waiting.remove(waiting)
                self.held += 2
                return []
            return [(node_id, alert)]
        if ranks.claims(node_id, alert.gpus):
            self._unsay(key)
            return []
        if ranks.active(now):
            self._waiting.append(_Waiting(key, node_id, alert, ranks.judged, now))
            return []
        return [(node_id, alert)]

    def due(self, now: float, ranks: RankHealth, final: bool = False) -> list[tuple[str, Alert]]:
        """The waiting alerts whose wait is over: said, or unsaid where the rank rule's judgement
        since names a rank there."""
        out: list[tuple[str, Alert]] = []
        still: list[_Waiting] = []
        for w in self._waiting:
            if ranks.judged > w.judged or final or now - w.since >= ranks.patience():
                if ranks.claims(w.node_id, w.alert.gpus):
                    self._unsay(w.key)
                else:
                    out.append((w.node_id, w.alert))
            else:
                still.append(w)
        self._waiting = still
        return out

    def forget(self, node_id: str) -> None:
        """A node lost or left: what waits of it is not said."""
        self._waiting = [w for w in self._waiting if w.node_id != node_id]
        self._unsaid = {k for k in self._unsaid if not (isinstance(k, tuple) and k[0] == node_id)}

    def _unsay(self, key: Hashable) -> None:
        self._unsaid.add(key)
        self.held += 1


def _episode(node_id: str, alert: Alert) -> Hashable:
    """What a flag and its recovery share: a node's straggler episode, or a GPU's of one rule."""
    if alert.kind in (EventKind.STRAGGLER, EventKind.RECOVERED):
        return (node_id, EventKind.STRAGGLER)
    return (node_id, alert.kind, alert.gpus)
