"""Waits from torch's flight recorder, where DDP's timers are not there (FSDP, DeepSpeed, a loop of
the user's own collectives) (pure: a dump's text in, durations out).

What a recorder entry holds (torch 2.13, ``_dump_fr_trace_json``), per process group and
collective: its sequence number (the same on every rank of the group) and ``time_created_ns``
(when this rank enqueued it, on its clock). On NCCL with ``TORCH_NCCL_ENABLE_TIMING=1`` an entry
also holds ``duration_ms``, the collective kernel's time on the device, which runs from the
rank's launch until every rank has joined and the data has moved: the rank that joins last has
the shortest, as in DDP's exposed wait. Matched by (group, sequence number), never by time, the
rank with the least summed duration over the same collectives is the one the others wait for.

On gloo the recorder gives no duration (checked on torch 2.13: ``time_discovered_started_ns``
and ``time_discovered_completed_ns`` stay 0, no ``duration_ms``), and its enqueue times only say
each rank's own cadence, equal on every rank of a synchronous job: it names no rank there.
``TORCH_NCCL_ENABLE_TIMING`` adds two CUDA events to every collective, so the plugin never sets
it: these durations exist where the user turned it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._flight import entry_group, entry_op, entry_seq, load_dump


@dataclass(frozen=True)
class TimedCollective:
    """One collective with a device duration, as one rank's recorder holds it."""

    pg: str
    seq: int
    op: str
    duration_s: float


@dataclass(frozen=True)
class CollectiveWait:
    """One rank's time in the collectives every rank timed: their count and its summed duration."""

    rank: int
    collectives: int
    total_s: float


def timed_collectives(text: str) -> list[TimedCollective]:
    """The completed collectives of a recorder dump (JSON text) that carry a duration; none for
    a gloo process group, or where timing is off. A ``ValueError`` for text that is not a dump."""
    out = []
    for entry in load_dump(text).get("entries") or []:
        duration = entry.get("duration_ms")
        if not isinstance(duration, (int, float)) or duration < 0 or entry.get("state") != "completed":
            continue
        seq = entry_seq(entry)
        if seq is None:
            continue
        out.append(TimedCollective(entry_group(entry)[0], seq, entry_op(entry), float(duration) / 1e3))
    return out


def collective_waits(per_rank: Mapping[int, list[TimedCollective]]) -> list[CollectiveWait]:
    """Every rank's summed duration over the collectives that every rank timed (matched by
    process group and sequence number); empty where they share none."""
    keys = None
    for collectives in per_rank.values():
        mine = {(c.pg, c.seq) for c in collectives}
        keys = mine if keys is None else keys & mine
    if not keys:
        return []
    out = []
    for rank in sorted(per_rank):
        durations = [c.duration_s for c in per_rank[rank] if (c.pg, c.seq) in keys]
        out.append(CollectiveWait(rank, len(keys), sum(durations)))
    return out
