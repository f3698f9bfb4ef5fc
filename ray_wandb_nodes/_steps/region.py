"""A rank's step anatomy in its beacon slot: the layout of the 256 bytes a version-2 slot keeps
for it (slot bytes 256-511), the writer the rank calls, and the decoder the node calls.

Every figure is a running total on the rank's own monotonic clock, with the step counts it
covers: the node (or the driver side) differences two reads of one rank and divides by the
steps between them, and compares ranks over the same steps. No field is a time of day or a
clock reading, so no two hosts' clocks ever meet (a rank's clock offset cancels in its own
differences).

Layout (little-endian, offsets within the region)::

    0    u64  seq      the region's own seqlock: odd while a write is under way
    8    u32  magic    "RWNS"
    12   u16  version  2 (a region of another version is not decoded)
    14   u16  sources  what was measured (:class:`Sources`)
    16   16 x u64      the totals of :class:`StepTotals`, in its field order
    144  ...           reserved, zero
    248  u64  seq_end  the same counter, written before the totals: a copy of the region taken
                       in one read is whole when seq is even and equal to seq_end

The writer stores ``seq`` (odd), ``seq_end`` (even), the totals, then ``seq`` (even). A reader
that copies the 256 bytes front to back in one read (``pread`` of the slot) and finds ``seq ==
seq_end`` has a whole copy; a reader that reads ``seq`` again after its copy (the beacon's own
seqlock discipline) may check that instead. Both rely on the writer's stores landing in program
order, as they do on x86-64 and as the beacon's own seqlock does.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, fields
from typing import NamedTuple

REGION_SIZE = 256
MAGIC = 0x534E5752  # b"RWNS" read as a little-endian u32
VERSION = 2  # 1: 13 totals, without the host-timed passes and collectives

_SEQ = struct.Struct("<Q")
_BODY = struct.Struct("<IHH16Q")  # magic, version, sources, then the 16 totals
_SEQ_AT, _BODY_AT, _SEQ_END_AT = 0, 8, 248
assert _BODY_AT + _BODY.size <= _SEQ_END_AT


class Sources(enum.IntFlag):
    """What a rank measured: a part whose source is missing is unknown, never zero."""

    NONE = 0
    INPUT = 1  # ``next()`` on a training iterator was timed at least once
    OPTIMIZER = 2  # the global optimizer-step hooks are in place
    DDP = 4  # DDP's reducer timers are read: forward, backward compute, exposed communication
    DDP_DEVICE = 8  # those timers are CUDA events: device time, sampled sparsely
    HOST_COMPUTE = 16  # forward (DDP's, FSDP's root) and backward calls timed on a CPU model: compute
    COLLECTIVES = 32  # the collectives a CPU model blocks in inside them timed (DDP's buffer sync, FSDP's)


@dataclass(frozen=True, slots=True)
class StepTotals:
    """One rank's running totals as read from its region (nanoseconds on its own clock).

    ``steps`` counts optimizer steps; the step parts (``step_ns``, ``input_ns``,
    ``optimizer_ns``) cover ``intervals`` intervals between two consecutive steps (the interval
    before the first step and those the rank was told to leave out are not counted). DDP's parts
    cover the ``ddp_samples`` iterations DDP timed up to ``ddp_iteration`` (the latest it timed):
    each of its first ten, then one in ``ddp_rate``, so every rank of a job times the same ones.

    What a node sends the driver side of each of its ranks, with the rank: 17 integers."""

    sources: Sources
    steps: int
    intervals: int
    step_ns: int
    input_ns: int
    batches: int  # ``next()`` calls in the counted intervals
    optimizer_ns: int
    ddp_iteration: int
    ddp_samples: int
    ddp_rate: int
    forward_ns: int  # DDP: from forward's start to backward's first gradient (the loss included)
    backward_ns: int  # DDP: backward compute, first to last gradient ready
    wait_ns: int  # DDP: exposed communication, from backward compute's end to communication's end
    # total communication (exposed and overlapped), from the first bucket's launch to the end
    comm_ns: int
    # every pass, on the rank's clock (``_worker.step_loops``), in the counted intervals:
    passes: int  # forward calls with grad of a DDP or FSDP model (micro-batches: k a step accumulating k)
    busy_ns: int  # inside those forward calls and every backward call, the collectives in them included
    collective_ns: int  # blocked inside them in collectives timed from Python (DDP's buffer sync, FSDP's)


class RankSteps(NamedTuple):
    """One rank's totals as its node read them off its slot: what a node logger's status carries
    of each rank of an attempt it watches (by the attempt's key: several a rank, in step order,
    see ``marks``), and what the driver side judges. ``pid``: the rank's process (0: not known)."""

    rank: int
    totals: StepTotals
    pid: int = 0


_TOTALS = tuple(f.name for f in fields(StepTotals))[1:]
assert len(_TOTALS) == 16
EMPTY = StepTotals(Sources.NONE, *(0,) * len(_TOTALS))


class RegionWriter:
    """Writes :class:`StepTotals` into a rank's region: a writable buffer of at least
    :data:`REGION_SIZE` bytes (the beacon's memoryview of slot bytes 256-511). One writer a
    region, on one thread; a write is four ``pack_into`` on the mapping: no system call."""

    def __init__(self, buffer: memoryview | bytearray) -> None:
        view = memoryview(buffer)
        if view.readonly or view.nbytes < REGION_SIZE:
            raise ValueError(
                f"the step region needs a writable buffer of {REGION_SIZE} bytes, got "
                f"{'a read-only one' if view.readonly else f'{view.nbytes} bytes'}"
            )
        self._view = view.cast("B")[:REGION_SIZE]
        self._seq = 0
        self._pack_seq = _SEQ.pack_into
        self._pack_body = _BODY.pack_into

    def write(self, sources: int, *totals: int) -> None:
        """Publish ``totals`` (the 16 fields of :class:`StepTotals` after ``sources``, in order)."""
        seq, view = self._seq, self._view
        self._pack_seq(view, _SEQ_AT, seq + 1)
        self._pack_seq(view, _SEQ_END_AT, seq + 2)
        self._pack_body(view, _BODY_AT, MAGIC, VERSION, sources, *totals)
        self._pack_seq(view, _SEQ_AT, seq + 2)
        self._seq = seq + 2

    def write_totals(self, totals: StepTotals) -> None:
        self.write(int(totals.sources), *(getattr(totals, name) for name in _TOTALS))

    def release(self) -> None:
        """Let go of the buffer (the beacon can then close its mapping)."""
        self._view.release()


def decode(raw: bytes | bytearray | memoryview) -> StepTotals | None:
    """The totals in one copy of a region; None for a region never written, of another version,
    or copied while a write was under way (read it again)."""
    if len(raw) < REGION_SIZE:
        return None
    (seq,) = _SEQ.unpack_from(raw, _SEQ_AT)
    (seq_end,) = _SEQ.unpack_from(raw, _SEQ_END_AT)
    if seq == 0 or seq % 2 or seq != seq_end:
        return None
    magic, version, sources, *totals = _BODY.unpack_from(raw, _BODY_AT)
    if magic != MAGIC or version != VERSION:
        return None
    return StepTotals(Sources(sources & 0xFFFF), *totals)
