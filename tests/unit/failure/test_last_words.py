"""A dead rank's last words (``_failure.last_words``): what its log's tail says of its end."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._failure import CollectiveAt, LastWords, read_last_words

# torch 2.13's ProcessGroupNCCL lines, as research/failures-real.md quotes them (their prefixes as printed).
NCCL_OLD = (
    "[rank4]:[E321 02:07:08.41 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for "
    "600067 milliseconds before timing out.\n"
    "[rank4]:[E321 02:07:08.42 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 4] Exception (either an error or timeout) "
    "detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.\n"
    "[rank4]:[E321 02:07:08.42 ProcessGroupNCCL.cpp:621] To avoid data inconsistency, we are taking the entire "
    "process down.\n"
)
NCCL_NEW = (
    "[rank2]:[E1206 07:10:31.41 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 2] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=10, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=15000) "
    "ran for 15067 milliseconds before timing out.\nFatal Python error: Aborted\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (NCCL_NEW, LastWords("SIGABRT", "NCCL's watchdog", CollectiveAt("0", 10, "broadcast", "default_pg"), 15.0)),
        (
            NCCL_OLD,
            LastWords("SIGABRT", "NCCL's watchdog", CollectiveAt("1", 1580, "all_reduce", "", 1579, 1582), 600.0),
        ),
        ("Fatal Python error: Segmentation fault\n\nThread 0x7f (most recent call first):\n", LastWords("SIGSEGV")),
        ("terminate called after throwing an instance of 'c10::Error'\n", LastWords("SIGABRT", "a C++ exception")),
        ("RuntimeError: CUDA error: an illegal memory access was encountered\n", LastWords("", "a CUDA error")),
        ("epoch 3 loss 0.41\nepoch 4 loss 0.39\n", LastWords()),  # a SIGKILL: nothing said
        ("", LastWords()),
    ],
)
def test_the_end_a_log_tail_says(text: str, expected: LastWords) -> None:
    said = read_last_words(text)
    assert (said.signal, said.by, said.watchdog, said.timeout_s) == (
        expected.signal, expected.by, expected.watchdog, expected.timeout_s,
    )  # fmt: skip
    assert said.found == bool(expected.signal or expected.by)
    assert len(said.lines) <= 6


def test_the_group_of_an_older_torch_line_is_read_from_its_exception_line() -> None:
    """torch before 2.6 names the group on the line after the watchdog's: ``[PG 1 Rank 4]``."""
    said = read_last_words(NCCL_OLD)
    assert said.watchdog is not None
    assert said.lines[0].endswith("ran for 600067 milliseconds before timing out.")


def test_nccl_s_remote_error_is_a_peer_lost_and_its_abort_a_sigabrt() -> None:
    said = read_last_words(
        "[PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with exception: NCCL error: "
        "remote process exited or there was a network error\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    )
    assert (said.peer_lost, said.signal, said.by, said.watchdog) == (True, "SIGABRT", "NCCL, a peer lost", None)


@pytest.mark.parametrize(
    ("text", "by"),
    [
        # A GPU fault NCCL reports: the rank's own error, not a peer's (its watchdog still aborts).
        (
            "[rank3]:[E1206 ProcessGroupNCCL.cpp:1537] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group "
            "watchdog thread terminated with exception: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO "
            "for details), NCCL version 2.27.3\nFatal Python error: Aborted\n",
            "an NCCL error",
        ),
        # An abort whose original reason is the rank's own error.
        (
            "NCCL communicator was aborted on rank 3. Original reason for failure was: NCCL error: "
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed\n",
            "an NCCL error",
        ),
        # The heartbeat monitor: the watchdog itself hung on this rank (a CUDA call that never returned).
        (
            "[rank5]:[E1206 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0(default_pg) Rank 5] ProcessGroupNCCL's "
            "watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.\n"
            "[rank5]:[F1206 ProcessGroupNCCL.cpp:1422] Terminating the process after attempting to dump debug info, "
            "due to collective timeout or exception.\n",
            "NCCL's heartbeat monitor (its watchdog hung on this rank)",
        ),
    ],
)
def test_a_ranks_own_nccl_error_or_hung_watchdog_is_its_own_not_a_peers(text: str, by: str) -> None:
    words = read_last_words(text)
    assert (words.by, words.peer_lost, words.watchdog) == (by, False, None)
    assert words.lines  # the lines that say so are kept for the account


def test_an_abort_for_a_remote_error_is_a_peer_lost() -> None:
    words = read_last_words(
        "NCCL communicator was aborted on rank 1. Original reason for failure was: NCCL error: remote process "
        "exited or there was a network error, NCCL version 2.27.3\nncclRemoteError: A call failed possibly due to "
        "a network error or a remote process exiting prematurely.\n"
    )
    assert words.peer_lost and words.by == "NCCL, a peer lost"


def test_the_dump_signals_line_is_kept_as_evidence() -> None:
    line = (
        "[rank2]:[E1206 ProcessGroupNCCL.cpp:1700] [PG ID 0 PG GUID 0(default_pg) Rank 2] Received a dump signal "
        "due to a collective timeout from rank 1 and we will try our best to dump the debug info. Last enqueued "
        "NCCL work: 1581, last completed NCCL work: 1580."
    )
    assert read_last_words(NCCL_NEW + line).lines[-1] == line[:300]
