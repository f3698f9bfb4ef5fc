"""A rank's bytes into the console's lines: splitting, carriage returns, control sequences, Ray's
markers, the cut of long lines and the bounded memory (tables of cases, a test clock)."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._console import MAX_LINE_BYTES, Kind, LineSplitter

ESC = "\x1b"

# (what the case is, the chunks as read, the lines out; the open line is ended by close())
CASES: list[tuple[str, list[bytes], list[str]]] = [
    ("whole lines, one chunk", [b"a\nb\n"], ["a", "b"]),
    ("a line split over chunks is one line", [b"hel", b"lo wo", b"rld\n"], ["hello world"]),
    ("empty lines are lines", [b"a\n\nb\n"], ["a", "", "b"]),
    ("an open line waits for its newline, or the end", [b"a\nopen"], ["a", "open"]),
    ("a progress bar is its last state", [b"\r 0%|\r 50%|#\r100%|##\n"], ["100%|##"]),
    ("states split over chunks", [b"\r 10%", b"|#\r 2", b"0%|##\n"], [" 20%|##"]),
    ("a trailing carriage return keeps the state before it", [b"50%\r\n"], ["50%"]),
    ("a new state overwrites the line", [b"long state\rX\n"], ["X"]),
    ("Windows line ends", [b"one\r\ntwo\r\n"], ["one", "two"]),
    ("a carriage return split from its state", [b"first\r", b"second\n"], ["second"]),
    (
        "cursor moves and erasing are dropped, colours kept",
        [f"{ESC}[Kred {ESC}[31mtext{ESC}[0m{ESC}[1A\n".encode()],
        [f"red {ESC}[31mtext{ESC}[0m"],
    ),
    (
        "Ray's markers for its log monitor are not the rank's output",
        [b":job_id:01000000\n:actor_name:RayTrainWorker\n:task_name:f\nhello\n"],
        ["hello"],
    ),
    ("a UTF-8 character split over chunks", ["héllo\n".encode()[:2], "héllo\n".encode()[2:]], ["héllo"]),
    ("bytes that are not UTF-8 are replaced", [b"bad \xff byte\n"], ["bad \ufffd byte"]),
]


@pytest.mark.parametrize(("chunks", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lines(chunks: list[bytes], expected: list[str]) -> None:
    splitter = LineSplitter()
    out = []
    for chunk in chunks:
        out += splitter.feed(chunk, now=0.0)
    out += splitter.close()
    assert [p.text for p in out] == expected
    assert all(p.kind is Kind.TEXT for p in out)


def test_a_line_longer_than_the_cap_keeps_its_start_and_says_how_much_was_cut() -> None:
    splitter = LineSplitter(max_bytes=10)
    out = splitter.feed(b"0123456789abcdef\nshort\n", now=0.0)
    assert [p.text for p in out] == ["0123456789 [... 6 more bytes]", "short"]
    # The same over chunks, on the slow path (an open line).
    splitter.feed(b"01234", now=0.0)
    assert [p.text for p in splitter.feed(b"56789abc\n", now=0.0)] == ["0123456789 [... 3 more bytes]"]


E_ACUTE, EURO, CLEF = "é".encode(), "€".encode(), "𝄞".encode()  # 2, 3 and 4 bytes in UTF-8

# (what the case is, the line's bytes, how they are read, the line out), the cap at 10 bytes:
# a character the cut would split is cut whole, its bytes counted with the cut.
CUTS: list[tuple[str, bytes, str]] = [
    ("ASCII: the cut where the cap is", b"0123456789abc", "0123456789 [... 3 more bytes]"),
    ("a 2-byte character across the cap", b"012345678" + E_ACUTE + b"x", "012345678 [... 3 more bytes]"),
    ("a 2-byte character that ends at the cap", b"01234567" + E_ACUTE + b"x", "01234567é [... 1 more bytes]"),
    ("a 3-byte character, 1 byte in", b"012345678" + EURO, "012345678 [... 3 more bytes]"),
    ("a 3-byte character, 2 bytes in", b"01234567" + EURO, "01234567 [... 3 more bytes]"),
    ("a 3-byte character that ends at the cap", b"0123456" + EURO + b"xy", "0123456€ [... 2 more bytes]"),
    ("a 4-byte character, 3 bytes in", b"0123456" + CLEF + b"x", "0123456 [... 5 more bytes]"),
    ("all multi-byte", EURO * 4, "€€€ [... 3 more bytes]"),
    (
        "bytes that are no UTF-8 at the cap are cut where they fall",
        b"012345678\xff\xfe",
        "012345678\ufffd [... 1 more bytes]",
    ),
    ("a lone continuation byte", b"01234567\x82\x82zz", "01234567\ufffd\ufffd [... 2 more bytes]"),
    ("a lead byte without its continuation", b"012345678\xe2z", "012345678 [... 2 more bytes]"),
]


@pytest.mark.parametrize("how", ["one chunk", "a byte at a time", "an open line"])
@pytest.mark.parametrize(("line", "expected"), [c[1:] for c in CUTS], ids=[c[0] for c in CUTS])
def test_a_cut_never_splits_a_character(line: bytes, expected: str, how: str) -> None:
    splitter = LineSplitter(max_bytes=10)
    if how == "one chunk":
        out = splitter.feed(line + b"\nnext\n", now=0.0)
    elif how == "a byte at a time":
        out = [p for i in range(len(line)) for p in splitter.feed(line[i : i + 1], now=0.0)]
        out += splitter.feed(b"\nnext\n", now=0.0)
    else:  # the line stays open to the stream's end
        out = splitter.feed(b"next\n" + line, now=0.0) + splitter.close()
    texts = [p.text for p in out]
    assert expected in texts and "next" in texts
    if _utf8(line):  # valid text never comes out with a replacement character
        assert not any("\ufffd" in t for t in texts), texts


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_memory_is_one_line_whatever_is_written_without_a_newline() -> None:
    splitter = LineSplitter()
    for _ in range(200):
        splitter.feed(b"x" * 65536, now=0.0)
        assert splitter.pending <= MAX_LINE_BYTES
    for _ in range(200):  # a progress bar that never ends its line
        splitter.feed(b"\r" + b"#" * 1000, now=0.0)
        assert splitter.pending <= MAX_LINE_BYTES
    (last,) = splitter.close()
    assert last.text == "#" * 1000


# A bar redrawn every second for 100 s, progress_every_s 30: (time, state, sent at that time).
BAR = [(t, f"{t:3d}%|".encode(), None) for t in range(0, 101)]


def test_an_open_progress_line_is_sent_at_most_every_interval_and_its_end_once() -> None:
    splitter = LineSplitter(progress_every_s=30.0)
    sent: list[tuple[float, str, Kind]] = []
    for t, state, _ in BAR:
        splitter.feed(b"\r" + state, now=float(t))
        piece = splitter.tick(float(t))
        if piece is not None:
            sent.append((t, piece.text, piece.kind))
    assert sent == [(30, " 30%|", Kind.PROGRESS), (60, " 60%|", Kind.PROGRESS), (90, " 90%|", Kind.PROGRESS)]
    (end,) = splitter.feed(b"\n", now=101.0)
    assert (end.text, end.kind) == ("100%|", Kind.TEXT)


def test_a_bar_that_stopped_changing_is_not_sent_again_and_its_end_not_twice() -> None:
    splitter = LineSplitter(progress_every_s=10.0)
    splitter.feed(b"\rstep 5/5", now=0.0)
    first = splitter.tick(10.0)
    assert first is not None and first.text == "step 5/5"
    assert splitter.tick(20.0) is None  # unchanged
    assert splitter.feed(b"\n", now=21.0) == []  # its last state is the one sent


def test_plain_lines_are_never_progress_snapshots() -> None:
    splitter = LineSplitter(progress_every_s=1.0)
    splitter.feed(b"a plain line being written", now=0.0)
    assert splitter.tick(100.0) is None


def test_after_a_skip_the_broken_line_is_dropped_up_to_its_newline() -> None:
    splitter = LineSplitter()
    assert [p.text for p in splitter.feed(b"whole\nhalf", now=0.0)] == ["whole"]
    assert [p.text for p in splitter.resync()] == ["half"]  # what was read of it before the skip
    assert [p.text for p in splitter.feed(b"...rest of a line\nnext\n", now=0.0)] == ["next"]
