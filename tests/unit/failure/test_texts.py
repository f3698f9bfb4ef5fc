"""Reading the libraries' words: the shape of a collective's error (real gloo texts, torch 2.13;
NCCL's as torch's ProcessGroupNCCL writes them), Ray's account of a dead worker (Ray 2.60's own,
captured; Ray 2.50's memory-monitor words), and the innermost frame of the user's code."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._failure import Kind, Shape, UserFrame, innermost_user_frame, ray_death, shape_of
from ray_wandb_nodes._failure.texts import causes_of, frames_of, short_message
from tests.support.failure_fixtures import ray_captures, records, world


def gloo_messages() -> dict[str, str]:
    out = {}
    for mode in ("kill", "raise", "exit"):
        for r in records(mode):
            if r.error_type == "RuntimeError":
                out.setdefault(r.message.split("]", 1)[1].split("[")[0].strip()[:40], r.message)
    return out


def test_the_captured_gloo_errors_are_each_a_peer_s() -> None:
    messages = gloo_messages()
    closed = [m for m in messages.values() if "Connection closed by peer" in m or "Connection reset by peer" in m]
    timed = [m for m in messages.values() if "Timed out waiting" in m]
    assert len(closed) >= 2 and timed, messages  # closed, reset, recv and send timeouts
    assert all(shape_of("RuntimeError", m) is Shape.PEER_CLOSED for m in closed)
    assert all(shape_of("RuntimeError", m) is Shape.PEER_TIMEOUT for m in timed)


@pytest.mark.parametrize(
    ("message", "shape"),
    [
        # torch's ProcessGroupNCCL and NCCLUtils
        ("NCCL communicator was aborted on rank 3. Original reason for failure was: NCCL error: remote process "
         "exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due "
         "to a network error or a remote process exiting prematurely.", Shape.PEER_CLOSED),
        ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64214, OpType=ALLGATHER, "
         "NumelIn=1, NumelOut=32, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
         Shape.PEER_TIMEOUT),
        ("CUDA error: an illegal memory access was encountered", Shape.OWN),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", Shape.OWN),
        ("bad shard 17", Shape.OWN),
    ],
)  # fmt: skip
def test_collective_shapes(message: str, shape: Shape) -> None:
    assert shape_of("RuntimeError", message) is shape


def test_ray_s_report_barrier_timing_out_follows_the_missing_ranks() -> None:
    from ray.train.v2._internal.exceptions import BroadcastCollectiveTimeoutError

    error = BroadcastCollectiveTimeoutError(time_elapsed=30.0, missing_ranks=[1], timeout_s=30.0)
    assert shape_of(type(error).__name__, str(error)) is Shape.BARRIER


def test_a_user_exception_caused_by_a_peer_s_collective_follows_it() -> None:
    cause = f"RuntimeError: {next(iter(gloo_messages().values()))}"
    assert shape_of("SyncError", "could not sync the gradients", [cause]) is not Shape.OWN
    assert shape_of("SyncError", "could not sync the gradients") is Shape.OWN


def test_ray_2_60_s_words_for_a_sigkilled_worker() -> None:
    error = next(e for e in ray_captures()["kill"]["poll"]["errors"] if e["died"])
    death = ray_death(error["error_type"], error["message"])
    assert death.kind is Kind.SIGNAL
    assert death.detail == ("Worker exit type: SYSTEM_ERROR; Worker unexpectedly exits with a connection error code 2")


def test_ray_2_60_s_memory_monitor() -> None:
    error = ray_captures()["oom"]["error"]
    death = ray_death(error["error_type"], error["message"])
    assert death.kind is Kind.OOM and death.memory.startswith("Memory on the node (IP: ")
    assert "GB used / " in death.memory and death.process_gb is not None


def test_ray_2_50_s_memory_monitor() -> None:
    # The 2.50 raylet's words (its binary's strings, assembled): the phrase the reader keys on is
    # the one every release since has kept.
    message = ("Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.5, ID: "
               "abc) was 61.20GB / 64.00GB (0.956250), which exceeds the memory usage threshold of 0.95. Ray "
               "killed this worker (ID: def) because it was the most recently scheduled task")  # fmt: skip
    death = ray_death("OutOfMemoryError", message)
    assert death.kind is Kind.OOM
    assert death.memory == "Memory on the node (IP: 10.0.0.5, ID: abc) was 61.20GB / 64.00GB"


def test_a_node_that_died_and_one_preempted() -> None:
    gcs = ("The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\n"
           "The actor died because its node has died. Node Id: 4f2a\n\tthe actor's node was terminated "
           "unexpectedly: health check failed due to missing too many heartbeats")  # fmt: skip
    assert ray_death("ActorDiedError", gcs).kind is Kind.LOST
    assert ray_death("ActorDiedError", "The actor died unexpectedly", preempted=True).kind is Kind.LOST


def test_frames_of_ray_s_traceback_text() -> None:
    error = next(e for e in ray_captures()["raise"]["poll"]["errors"] if e["traceback"])
    frames = frames_of(error["traceback"])
    assert frames and frames[-1].function == "train_loop"
    assert frames[-1].code == 'raise ValueError("bad shard 17")'


def test_the_innermost_user_frame_skips_libraries() -> None:
    frames = [
        UserFrame("/home/me/train.py", 12, "main", "step(batch)"),
        UserFrame("/home/me/model.py", 40, "step", "dist.all_reduce(grads)"),
        UserFrame("/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83, "wrapper"),
        UserFrame("/usr/lib/python3.11/threading.py", 982, "run"),
    ]
    assert innermost_user_frame(frames) == frames[1]
    assert innermost_user_frame(frames[2:]) == frames[3]  # only libraries: the innermost
    assert innermost_user_frame([]) is None


def test_short_messages_drop_gloo_s_source_and_advice() -> None:
    message = next(m for m in gloo_messages().values() if "Connection closed by peer" in m)
    short = short_message(message)
    assert short.startswith("Connection closed by peer [127.0.0.1]:") and "typically" not in short
    assert world("kill")["world"] == 4


def test_the_causes_a_traceback_s_text_shows() -> None:
    gloo = next(m for m in gloo_messages().values() if "Connection closed by peer" in m)
    text = (
        'Traceback (most recent call last):\n  File "/job/train.py", line 9, in step\n    dist.all_reduce(t)\n'
        f"RuntimeError: {gloo}\n\nThe above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "/job/train.py", line 12, in loop\n    step()\n'
        "SyncError: could not sync the gradients\n"
    )  # fmt: skip
    assert causes_of(text) == (f"RuntimeError: {gloo.splitlines()[-1]}",)
    assert shape_of("SyncError", "could not sync the gradients", causes_of(text)) is Shape.PEER_CLOSED
    assert causes_of('Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: x\n') == ()
