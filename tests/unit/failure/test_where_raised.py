"""Whether a failure follows a peer, judged by where it was raised (the traceback's frames), a
collective library's own types and words, never by "reset by peer" alone; and the collective an
error names (``collective_of``), from NCCL's watchdog lines and the real gloo captures."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._failure import Kind, RankFailure, Shape, Window, choose, failure_notice, shape_of
from ray_wandb_nodes._failure.facts import CollectiveAt
from ray_wandb_nodes._failure.texts import collective_of, raised_in, raises_of
from tests.support.failure_fixtures import records

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
RESET = "[Errno 104] Connection reset by peer"


def traceback(frames: list[tuple[str, str, str]], last: str) -> str:
    """A Python traceback's text: ``frames`` (file, function, code) outermost first, then ``last``."""
    lines = ["Traceback (most recent call last):"]
    for i, (file, function, code) in enumerate(frames):
        lines += [f'  File "{file}", line {10 + i}, in {function}', f"    {code}"]
    return "\n".join([*lines, last]) + "\n"


# The user's own S3 read: botocore, urllib3, the standard library's ssl and socket.
S3_READ = traceback(
    [("/job/train.py", "train_loop", "shard = load_shard(i)"), ("/job/data.py", "load_shard", "body.read()"),
     (f"{SITE}/botocore/response.py", "read", "chunk = self._raw_stream.read()"),
     (f"{SITE}/urllib3/response.py", "read", "data = self._fp_read(amt)"),
     (f"{STDLIB}/ssl.py", "recv_into", "return self.read(nbytes, buffer)")],
    f"ConnectionResetError: {RESET}",
)  # fmt: skip
# The same error, raised inside torch.distributed's all_reduce.
IN_ALL_REDUCE = traceback(
    [("/job/train.py", "train_loop", "dist.all_reduce(grads)"),
     (f"{SITE}/torch/distributed/c10d_logger.py", "wrapper", "return func(*args, **kwargs)"),
     (f"{SITE}/torch/distributed/distributed_c10d.py", "all_reduce", "work.wait()")],
    f"ConnectionResetError: {RESET}",
)  # fmt: skip
# DDP's reducer: gloo's error surfaces in backward, from autograd's engine (torch's code, not c10d's).
GLOO = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:39467. This is "
        "typically caused by a remote worker crashing.")  # fmt: skip
IN_BACKWARD = traceback(
    [("/job/train.py", "train_loop", "loss.backward()"), (f"{SITE}/torch/_tensor.py", "backward", "torch.autograd."),
     (f"{SITE}/torch/autograd/graph.py", "_engine_run_backward", "return Variable._execution_engine")],
    f"RuntimeError: {GLOO}",
)  # fmt: skip
# A collective's own argument check: raised in c10d, but nothing of a peer in it.
BAD_ARGUMENT = traceback(
    [("/job/train.py", "train_loop", "dist.all_reduce(grads, op=7)"),
     (f"{SITE}/torch/distributed/distributed_c10d.py", "all_reduce", "raise ValueError(...)")],
    "ValueError: Invalid function argument: op 7",
)  # fmt: skip


@pytest.mark.parametrize(
    ("error_type", "message", "text", "shape"),
    [
        ("ConnectionResetError", RESET, S3_READ, Shape.OWN),  # the user's own socket: its own failure
        ("ConnectionResetError", RESET, IN_ALL_REDUCE, Shape.PEER_CLOSED),
        ("RuntimeError", GLOO, IN_BACKWARD, Shape.PEER_CLOSED),  # DDP's reducer, by gloo's own words
        ("ValueError", "Invalid function argument: op 7", BAD_ARGUMENT, Shape.OWN),
        ("BrokenPipeError", "[Errno 32] Broken pipe", traceback([("/job/log.py", "send", "sock.sendall(b)")],
                                                                "BrokenPipeError: [Errno 32] Broken pipe"), Shape.OWN),
        ("TimeoutError", "The read operation timed out", traceback(
            [("/job/data.py", "fetch", "r.read()"), (f"{STDLIB}/socket.py", "readinto", "return recv_into(b)")],
            "TimeoutError: The read operation timed out"), Shape.OWN),
    ],
)  # fmt: skip
def test_a_failure_follows_a_peer_by_where_it_was_raised(
    error_type: str, message: str, text: str, shape: Shape
) -> None:
    assert shape_of(error_type, message, (), text) is shape


@pytest.mark.parametrize(
    ("error_type", "message", "shape"),
    [
        # No traceback at all: only a collective library's own type or words can tell.
        ("ConnectionResetError", RESET, Shape.OWN),
        ("OSError", "operation timed out", Shape.OWN),
        ("RuntimeError", GLOO, Shape.PEER_CLOSED),
        ("torch.distributed.DistNetworkError", "failed to recv, got 0 bytes", Shape.PEER_CLOSED),
        ("DistStoreError", "Timed out after 1801 seconds waiting for clients. 3/4 clients joined.", Shape.PEER_TIMEOUT),
        ("DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error", Shape.OWN),
        ("DistBackendError", "[Rank 0] Work WorkNCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=600000) timed out in "
                             "blocking wait (TORCH_NCCL_BLOCKING_WAIT=1).", Shape.PEER_TIMEOUT),
    ],
)  # fmt: skip
def test_without_frames_only_a_collective_s_own_type_or_words_follow_a_peer(
    error_type: str, message: str, shape: Shape
) -> None:
    assert shape_of(error_type, message) is shape


def test_an_exception_raised_because_a_collective_lost_its_peer_follows_it() -> None:
    cause = "\nThe above exception was the direct cause of the following exception:\n\n"
    chained = (
        IN_ALL_REDUCE
        + cause
        + traceback([("/job/train.py", "step", "raise SyncError() from e")], "SyncError: gradients")
    )
    assert [r.error_type for r in raises_of(chained)] == ["ConnectionResetError", "SyncError"]
    assert shape_of("SyncError", "gradients", (), chained) is Shape.PEER_CLOSED
    own = (
        S3_READ
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + traceback([("/job/train.py", "train_loop", "raise DataError(...)")], "DataError: shard 3 unreadable")
    )
    assert shape_of("DataError", "shard 3 unreadable", (f"ConnectionResetError: {RESET}",), own) is Shape.OWN


def test_where_raised() -> None:
    assert raised_in(raises_of(S3_READ)[0].frames) == "elsewhere"
    assert raised_in(raises_of(IN_ALL_REDUCE)[0].frames) == "distributed"
    assert raised_in(raises_of(IN_BACKWARD)[0].frames) == "torch"
    assert raised_in(()) == ""


def s3_failure(rank: int, node: str) -> RankFailure:
    return RankFailure(rank, node, (), Kind.RAISED, shape_of("ConnectionResetError", RESET, (), S3_READ),
                       "ConnectionResetError", RESET, None, S3_READ, window=Window(500, 500))  # fmt: skip


def test_a_rank_s_own_socket_error_is_a_cause_alone_and_beside_a_peer_s_death() -> None:
    alone = choose([s3_failure(2, "node-1")])
    assert alone.first is not None and alone.first.ranks == (2,)
    notice = failure_notice(alone)
    assert notice.title == f"Rank 2 failed: ConnectionResetError: {RESET}"
    assert "no rank's own failure was seen" not in notice.text
    # Beside a rank killed on another node, with its peers' all_reduce failing: both causes, at once.
    killed = RankFailure(5, "node-2", (), Kind.SIGNAL, window=Window(100, 200))
    waiters = [RankFailure(r, "node-0", (), Kind.RAISED, shape_of("RuntimeError", GLOO, (), IN_BACKWARD),
                           "RuntimeError", GLOO, None, IN_BACKWARD) for r in (0, 1)]  # fmt: skip
    verdict = choose([*waiters, s3_failure(2, "node-1"), killed])
    assert sorted(c.ranks for c in verdict.causes) == [(2,), (5,)]
    assert [f.rank for f in verdict.consequences] == [0, 1]
    assert "no rank's own failure was seen" not in failure_notice(verdict).text


def test_the_same_error_raised_in_all_reduce_is_a_consequence() -> None:
    waiter = RankFailure(2, "node-1", (), Kind.RAISED, shape_of("ConnectionResetError", RESET, (), IN_ALL_REDUCE),
                         "ConnectionResetError", RESET, None, IN_ALL_REDUCE)  # fmt: skip
    killed = RankFailure(5, "node-2", (), Kind.SIGNAL, window=Window(100, 200))
    verdict = choose([waiter, killed])
    assert [c.ranks for c in verdict.causes] == [(5,)] and [f.rank for f in verdict.consequences] == [2]


def test_a_cascade_of_8000_waiters_behind_one_dead_rank() -> None:
    # 1,000 nodes of 8 ranks; rank 4,711 killed; every other rank's all_reduce timed out (gloo's own
    # record of rank 0 of the real capture, its traceback in c10d).
    real = next(r for r in records("raise") if r.rank == 0)
    shape = shape_of(real.error_type, real.message, real.causes, real.traceback)
    assert shape is Shape.PEER_TIMEOUT
    failures = [
        RankFailure(r, f"node-{r // 8}", (str(r % 8),), Kind.RAISED, shape, real.error_type, real.message,
                    real.frame, real.traceback, window=Window(10_000 + r, 10_000 + r))
        if r != 4711 else RankFailure(r, f"node-{r // 8}", (str(r % 8),), Kind.SIGNAL, window=Window(100, 200))
        for r in range(8000)
    ]  # fmt: skip
    verdict = choose(failures)
    assert [c.ranks for c in verdict.causes] == [(4711,)]
    assert len(verdict.consequences) == 7999 and 4711 not in {f.rank for f in verdict.consequences}
    notice = failure_notice(verdict)
    assert notice.title.startswith("Rank 4711: died with no Python exception")
    assert len(notice.text) < 2000 and len(notice.text.splitlines()) < 12, notice.text
    assert "ranks 0-4710,4712-7999: a collective timed out waiting for its peers" in notice.text


def test_no_consequence_where_every_failure_is_its_own() -> None:
    # The rule does not fire on failures of their own: one config error on 8,000 ranks is one cause.
    failures = [RankFailure(r, f"node-{r // 8}", (), Kind.RAISED, Shape.OWN, "KeyError", "'lr'") for r in range(8000)]
    verdict = choose(failures)
    assert [c.ranks for c in verdict.causes] == [tuple(range(8000))] and verdict.consequences == ()


# The collective an error names ------------------------------------------------------------------
WATCHDOG = ("[rank4]:[E321 02:07:08.41 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
            "Timeout(ms)=600000) ran for 600067 milliseconds before timing out.\n"
            "[rank4]:[E321 02:07:08.41 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 4] Exception (either an error or "
            "timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: "
            "1579.")  # fmt: skip


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (WATCHDOG, CollectiveAt("1", 1580, "all_reduce", "", 1579, 1582)),
        ("[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either "
         "an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL "
         "work: 6462.", CollectiveAt("0", 6463, "", "default_pg", 6462, 6463)),
        ("[rank3]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure "
         "detected by watchdog at work sequence id: 59958 PG status: last enqueued work: 59998, last completed work: "
         "59957", CollectiveAt("0", 59958, "", "default_pg", 59957, 59998)),
        ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, OpType=ALLGATHER, NumelIn=1, "
         "NumelOut=4, Timeout(ms)=600000) ran for 600038 milliseconds before timing out.",
         CollectiveAt("", 57, "all_gather", "")),
        ("[Rank 0] Work WorkNCCL(SeqNum=12, OpType=_REDUCE_SCATTER_BASE, Timeout(ms)=60000) timed out in blocking wait",
         CollectiveAt("", 12, "reduce_scatter_tensor", "")),
        ("bad shard 17", None),
        (GLOO, None),  # gloo says neither the collective nor its number: the traceback may
    ],
)  # fmt: skip
def test_collective_of_nccl_s_words(message: str, expected: CollectiveAt | None) -> None:
    assert collective_of(message) == expected


def test_collective_of_a_gloo_timeout_names_the_collective_from_its_frame() -> None:
    real = next(r for r in records("raise") if r.rank == 0)
    assert "Timed out waiting" in real.message
    assert collective_of(real.message, real.traceback) == CollectiveAt("", None, "all_reduce")
    assert collective_of("Connection reset by peer", S3_READ) is None


def test_a_timeout_whose_cause_lost_its_peer_is_a_lost_peer_as_the_chain_says() -> None:
    # The words of the last exception alone would say "timed out"; its cause, a closed connection,
    # decides (a lost peer before a wait), with the causes given or only in the traceback's text.
    timeout = next(r for r in records("raise") if r.rank == 0)
    cause = "\nDuring handling of the above exception, another exception occurred:\n\n"
    text = IN_BACKWARD + cause + timeout.traceback
    assert shape_of(timeout.error_type, timeout.message, (f"RuntimeError: {GLOO}",), text) is Shape.PEER_CLOSED
    assert shape_of(timeout.error_type, timeout.message, (), text) is Shape.PEER_CLOSED
    assert shape_of(timeout.error_type, timeout.message, (), timeout.traceback) is Shape.PEER_TIMEOUT
