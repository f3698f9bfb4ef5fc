"""The step region of a rank's beacon slot: its layout, its writer and its decoder, and that one
copy of it taken while a write is under way is never decoded as a mix of two writes."""

from __future__ import annotations

import mmap
import random
import struct

import pytest

from ray_wandb_nodes._steps import REGION_SIZE, RegionWriter, Sources, StepTotals, decode
from ray_wandb_nodes._steps.region import EMPTY, MAGIC, VERSION

TOTALS = StepTotals(Sources.INPUT | Sources.OPTIMIZER | Sources.DDP, *range(101, 117))


def test_what_the_writer_writes_the_decoder_reads_back() -> None:
    buffer = bytearray(REGION_SIZE)
    RegionWriter(buffer).write_totals(TOTALS)
    assert decode(bytes(buffer)) == TOTALS


def test_the_layout_is_the_documented_one() -> None:
    buffer = bytearray(REGION_SIZE)
    writer = RegionWriter(buffer)
    writer.write_totals(TOTALS)
    writer.write_totals(TOTALS)
    seq, magic, version, sources = struct.unpack_from("<QIHH", buffer, 0)
    assert (seq, magic, version, sources) == (4, MAGIC, VERSION, 7)
    assert bytes(buffer[8:12]) == b"RWNS"
    assert struct.unpack_from("<16Q", buffer, 16) == tuple(range(101, 117))
    assert struct.unpack_from("<Q", buffer, 248) == (4,)
    assert bytes(buffer[144:248]) == bytes(104)  # reserved


def test_it_writes_into_the_slot_s_bytes_256_to_511_and_nowhere_else() -> None:
    slot = mmap.mmap(-1, 512)
    slot[:256] = b"\xab" * 256  # the beacon's own half
    view = memoryview(slot)[256:512]
    writer = RegionWriter(view)
    writer.write_totals(TOTALS)
    assert slot[:256] == b"\xab" * 256
    assert decode(slot[256:512]) == TOTALS
    writer.release()
    view.release()
    slot.close()


@pytest.mark.parametrize("raw", [bytes(REGION_SIZE), bytes(100)])
def test_a_region_never_written_or_too_short_decodes_to_nothing(raw: bytes) -> None:
    assert decode(raw) is None


def test_a_version_1_region_of_13_totals_is_refused_not_misread() -> None:
    """A rank of the plugin's earlier release beside a node of this one: its layout has 13 totals."""
    assert VERSION == 2
    buffer = bytearray(REGION_SIZE)
    struct.pack_into("<QIHH13Q", buffer, 0, 2, MAGIC, 1, 7, *range(101, 114))
    struct.pack_into("<Q", buffer, 248, 2)
    assert decode(bytes(buffer)) is None


def test_another_version_or_magic_decodes_to_nothing() -> None:
    for offset, value in ((8, b"XXXX"), (12, b"\x09\x00")):
        buffer = bytearray(REGION_SIZE)
        RegionWriter(buffer).write_totals(TOTALS)
        buffer[offset : offset + len(value)] = value
        assert decode(bytes(buffer)) is None


def test_the_writer_needs_a_writable_buffer_of_256_bytes() -> None:
    with pytest.raises(ValueError, match="256 bytes, got 255 bytes"):
        RegionWriter(bytearray(255))
    with pytest.raises(ValueError, match="read-only"):
        RegionWriter(memoryview(bytes(256)))


def _store_events(old: StepTotals, new: StepTotals) -> tuple[bytes, list[tuple[int, int]]]:
    """The region holding ``old``, and the stores of the writer's next write (of ``new``) byte by
    byte in program order, (offset, value): each ``pack_into`` stores its bytes front to back."""
    region = bytearray(REGION_SIZE)
    writer = RegionWriter(region)
    writer.write_totals(old)
    original = bytes(region)
    events: list[tuple[int, int]] = []
    real_seq, real_body = writer._pack_seq, writer._pack_body

    def seq(view: memoryview, at: int, value: int) -> None:
        events.extend((at + i, b) for i, b in enumerate(struct.pack("<Q", value)))
        real_seq(view, at, value)

    def body(view: memoryview, at: int, *values: int) -> None:
        events.extend((at + i, b) for i, b in enumerate(struct.pack("<IHH16Q", *values)))
        real_body(view, at, *values)

    writer._pack_seq, writer._pack_body = seq, body  # type: ignore[method-assign]
    writer.write_totals(new)
    assert decode(bytes(region)) == new
    return original, events


def test_one_copy_taken_front_to_back_during_a_write_is_whole_or_refused() -> None:
    """A reader's single ``pread`` copies bytes in increasing order while the writer stores: byte
    ``i`` of the copy is the region after the first ``c_i`` stores, ``c`` never decreasing. Every
    such copy decodes to the old totals, the new ones, or nothing; and one that ``seq`` read again
    afterwards calls whole is whole."""
    old = TOTALS
    new = StepTotals(Sources.INPUT, *range(900, 916))
    original, events = _store_events(old, new)
    rng = random.Random(3)
    outcomes = set()
    for _ in range(4000):
        # The copy stalls at a few bytes while the writer runs on: cut levels that step up there.
        at = sorted(rng.sample(range(REGION_SIZE), rng.randint(1, 3)))
        levels = sorted(rng.randint(0, len(events)) for _ in range(len(at) + 1))
        cuts = [levels[sum(1 for a in at if a <= i)] for i in range(REGION_SIZE)]
        state, applied, copy = bytearray(original), 0, bytearray(REGION_SIZE)
        for i in range(REGION_SIZE):
            while applied < cuts[i]:
                at, value = events[applied]
                state[at] = value
                applied += 1
            copy[i] = state[i]
        got = decode(bytes(copy))
        assert got in (None, old, new)
        outcomes.add("none" if got is None else "old" if got == old else "new")
        # The beacon's reader reads ``seq`` again after its copy: equal and even, the copy is whole.
        while applied < rng.randint(cuts[-1], len(events)):
            at, value = events[applied]
            state[at] = value
            applied += 1
        if state[:8] == copy[:8] and copy[0] % 2 == 0:
            copy[248:256] = copy[:8]  # judged by the re-read alone, not by seq_end
            assert decode(bytes(copy)) in (old, new)
    assert outcomes == {"none", "old", "new"}


def test_the_empty_totals_have_every_field_zero() -> None:
    assert EMPTY.steps == 0 and EMPTY.sources == Sources.NONE
