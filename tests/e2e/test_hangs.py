"""Hangs named live, end to end: a real TorchTrainer over gloo on two nodes, four ranks, armed by
the plugin with no user code. One fit goes through every kind of hang in turn, each released by
the test (or by itself) once its alert is in the run: a rank stuck in Python while the others wait
in all_reduce; a rank stuck in native code that holds the GIL; every rank stuck in one place; a
rank that skips a report while the others wait in Ray's report barrier; with TP pairs under the
default group (each pair's sequence numbers its own), a rank stopped before its pair's
all_reduces while its partner waits in the pair's and the other pair in the default group's
(only it is named). Around them, slow phases
that are not hangs: a long first step and a checkpoint upload ten times a step. The node loggers
read the beacons, the evidence is taken out of band, and the alerts, the ``hangs`` table and the
stack files reach the test backend through the real wandb client. With ``on_hang="restart"``: a
hung attempt ended and restarted from its checkpoint, the run ended when no failure is left, and
a save longer than the running limit before its report that is no hang and restarts nothing."""

from __future__ import annotations

import io
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._config.values import HangTimeout
from ray_wandb_nodes._fleet import poll_s
from ray_wandb_nodes._fleet.hang_nodes import EVIDENCE_TIMEOUT_S
from ray_wandb_nodes._hang.native import py_spy
from tests.support.cluster import assert_nothing_left, node_labels
from tests.support.env import offline_backend
from tests.support.runs import rank_console, run_of, unique
from tests.support.source import line_of
from tests.support.training import make_callback, said, trainer
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster
TOPOLOGY = "two_nodes"
REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__)  # the train functions here carry the markers the alerts' places are checked by
WORLD, STEPS = 4, 12
# 8 s: the first step's limit (3 x) is then 24 s from the train function's start. The ranks' set-up
# before it (the process groups, and the optimizer, whose creation imports torch._dynamo: 1.3 s on
# a quiet core) took over 19 s on 2 cores running two test streams and a venv build (its stacks
# in linecache and tokenize, called from the optimizer's line).
HANG_TIMEOUT_S = 8.0
SAMPLING_S = 2.0
# The fleet reads a run's beacons every poll_s (a sixteenth of a fixed limit, at least 0.25 s); a
# reading older than the limit is taken again first (one or two polls more).
POLL_S = poll_s(HangTimeout(seconds=HANG_TIMEOUT_S), 3.0)
# The first step comes this long after the train function starts (the beacon's clock starts with
# it), whatever the process groups' set-up before it took on a loaded machine: past the running
# limit by four polls (a rule that judged it as running would see it), and 7 s under the first
# step's own limit (3 x) for the step itself, which was 2-3 s of a sleep after set-up that took
# seconds under load when the sleep was a fixed 4 s after it.
FIRST_STEP_S = HANG_TIMEOUT_S + 4 * POLL_S
# The native call returns when the test releases it (on the hang's alert), or by itself after this
# ceiling: past the latest the alert may come (LATE_S, below), so that the rank is still held in C
# when its evidence is taken however slow the round.
GIL_HELD_S = 60.0
# A checkpoint's upload: inside Ray's checkpoint hook, allowed 3 x. Its age is counted from the
# phase's start (entering a phase is progress), so the load before it adds nothing: the upload
# is twice the running limit, and leaves a third of the 3 x for the copy and the phase's end.
UPLOAD_S = 2 * HANG_TIMEOUT_S
# How late an alert may come after a rank stops, by the product's own bounds: the limit, three
# polls, the evidence round (the fleet waits at most EVIDENCE_TIMEOUT_S for the nodes' dumps, 18
# s: each node's own 5 s, 8 s of py-spy and 5 s for the answer's way; past it the alert goes without
# the node's), and the alert's way to W&B (the primary's request to the local backend, and the
# test's poll of it every 0.2 s): 1 s. Seen on 2 cores: 4.4 to 7.1 s (docs/performance.md).
LATE_S = HANG_TIMEOUT_S + 3 * POLL_S + EVIDENCE_TIMEOUT_S + 1.0
# step -> (ranks that stop, how): each episode's hang
EPISODES = {
    2: ((3,), "python"), 4: ((2,), "native"), 6: ((0, 1, 2, 3), "python"), 8: ((1,), "report"), 9: ((3,), "groups"),
}  # fmt: skip
# all_reduces a step in each pair's group: the pairs' and the default group's numbers part (by
# step 9 ranks 2-3's pair is at #46, the default group at #30, ranks 0-1's pair at #10)
PAIR_COLLECTIVES = (1, 5)
CHECKPOINT_STEP = 10


def load_next_shard(release: str) -> None:
    """A data function that stops (a stalled file system, say) until the test releases it."""
    while not os.path.exists(release):
        time.sleep(0.05)  # <load_next_shard>


def read_from_device(lib: str, seconds: float, release: str) -> None:
    import ctypes

    ctypes.PyDLL(lib).rwn_hold_gil_until(release.encode(), ctypes.c_double(seconds))  # <read_from_device>


def slow_upload(checkpoint: Any, dir_name: str) -> Any:
    import ray.train

    time.sleep(UPLOAD_S)
    dest = os.path.join(ray.train.get_context().get_storage().experiment_fs_path, dir_name)
    shutil.copytree(checkpoint.path, dest, dirs_exist_ok=True)
    return ray.train.Checkpoint(dest)


def stop(config: dict[str, Any], step: int, rank: int, how: str) -> None:
    ranks, kind = EPISODES.get(step, ((), ""))
    if rank in ranks and kind == how:
        Path(config["dir"], f"stuck-{step}-{rank}").write_text(str(time.time()))
        if how == "native":
            read_from_device(config["gil"], GIL_HELD_S, os.path.join(config["dir"], f"release-{step}"))
        else:
            load_next_shard(os.path.join(config["dir"], f"release-{step}"))


def hang_loop(config: dict[str, Any]) -> None:
    import tempfile

    import ray.train
    import torch
    import torch.distributed as dist

    started = time.monotonic()  # the train function starts, and the beacon's clock with it
    rank = ray.train.get_context().get_world_rank()
    # TP pairs under the default group: every rank creates both, in one order (torch's rule)
    pairs = [dist.new_group([0, 1], group_desc="pair_0_1"), dist.new_group([2, 3], group_desc="pair_2_3")]
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # A long first step (a model load, a compile): no hang. FIRST_STEP_S from the start, however
    # long the set-up above took.
    time.sleep(max(0.0, started + FIRST_STEP_S - time.monotonic()))
    for step in range(STEPS):
        stop(config, step, rank, "python")
        stop(config, step, rank, "native")
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)  # <all_reduce>
        optimizer.step()  # each rank's progress, through torch's hook: no user code
        stop(config, step, rank, "groups")
        for _ in range(PAIR_COLLECTIVES[rank // 2]):
            dist.all_reduce(loss.detach(), group=pairs[rank // 2])  # <pair_all_reduce>
        dist.all_reduce(loss.detach())  # <loss_all_reduce>
        stop(config, step, rank, "report")
        if step == CHECKPOINT_STEP and rank == 0 and config["slow_upload"]:
            with tempfile.TemporaryDirectory() as d:
                Path(d, "model").write_text("weights")
                ray.train.report(
                    {"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d), checkpoint_upload_fn=slow_upload
                )
        else:
            ray.train.report({"step": step})  # <report>


def checkpoint_hooks() -> bool:
    """Whether this Ray has the worker's checkpoint hooks (the upload is then a checkpoint phase)."""
    from ray.train.v2._internal.execution.callback import TrainContextCallback

    return hasattr(TrainContextCallback, "on_checkpoint_transfer")


def hang_alerts(backend: WandbTestBackend, name: str) -> list[dict[str, Any]]:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return [a for a in runs[0].alerts if a["title"].startswith("Hang")] if runs else []


def test_every_kind_of_hang_is_named_live_with_every_ranks_stacks_and_slow_phases_are_not(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path, gil_lib: str
) -> None:
    from ray.train import RunConfig, ScalingConfig

    name = unique("hangs")
    slow_upload = checkpoint_hooks()
    config = {"dir": str(tmp_path), "gil": gil_lib, "slow_upload": slow_upload}
    callback = make_callback(hang_timeout_s=HANG_TIMEOUT_S, sampling_interval_s=SAMPLING_S)
    result: dict[str, Any] = {}

    def run() -> None:
        result["fit"] = trainer(
            hang_loop,
            torch=True,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage"), callbacks=[callback]),
        ).fit()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    late: dict[int, float] = {}
    try:
        for k, (step, (ranks, _)) in enumerate(sorted(EPISODES.items())):
            wait_until(lambda k=k: (hang_alerts(backend, name)[2 * k :] or [None])[0], 240, f"hang {k + 1}")
            stuck = [tmp_path / f"stuck-{step}-{r}" for r in ranks]
            said = "\n\n".join(f"{a['severity']} {a['title']}\n{a['text']}" for a in hang_alerts(backend, name))
            assert all(p.exists() for p in stuck), f"an alert before episode {k + 1}'s stop:\n{said}"
            late[step] = time.time() - max(float(p.read_text()) for p in stuck)
            (tmp_path / f"release-{step}").touch()
            wait_until(lambda k=k: len(hang_alerts(backend, name)) >= 2 * k + 2, 120, f"the end of hang {k + 1}")
    finally:
        for step in EPISODES:
            (tmp_path / f"release-{step}").touch()
    thread.join(timeout=240)
    assert not thread.is_alive() and result["fit"].error is None, result

    alerts = hang_alerts(backend, name)
    for f in sorted(f for f in run_of(backend, name).files if f.startswith("hangs/hang-1/")):
        print(f"--- {f}\n{run_of(backend, name).files[f].decode()}")
    for a in alerts:
        print(f"{a['severity']} {a['title']}\n{a['text']}\n")
    print("seconds from the stop to the alert:", {s: round(t, 1) for s, t in late.items()})
    titles = [a["title"] for a in alerts]
    assert titles == [
        "Hang: rank 3 stopped", "Hang over: ranks 0-3 progress again",
        "Hang: rank 2 stopped", "Hang over: ranks 0-3 progress again",
        "Hang: ranks 0-3 stopped", "Hang over: ranks 0-3 progress again",
        "Hang: rank 1 stopped", "Hang over: ranks 0-3 progress again",
        "Hang: rank 3 stopped", "Hang over: ranks 0-3 progress again",
    ], titles  # fmt: skip
    assert [a["severity"] for a in alerts] == ["ERROR", "INFO"] * 5
    first = [a["text"].splitlines()[0] for a in alerts[::2]]
    shard, reduce = line_of(HERE, "load_next_shard"), line_of(HERE, "all_reduce")
    # A waiter's flight recorder comes with its Python-level dump, which a loaded node may not give
    # within the wait: then the number is unknown and the stopped rank is "not in it".
    assert re.match(rf"ranks 0-2 wait in all_reduce( #\d+)? \(test_hangs.py:{reduce}\); rank 3 ", first[0]), first[0]
    assert re.search(rf"rank 3 (never entered it|is not in it): in load_next_shard \(test_hangs.py:{shard}\)", first[0])
    assert re.match(rf"ranks 0-1,3 wait in all_reduce( #\d+)? \(test_hangs.py:{reduce}\); ", first[1]), first[1]
    assert f"rank 2 is not in it: in read_from_device (test_hangs.py:{line_of(HERE, 'read_from_device')})" in first[1]
    # The flight recorder's sequence number, at least once: in an alert, or a waiter's rank file.
    waiter_files = [run_of(backend, name).files.get(f"hangs/hang-{k}/rank-0.txt", b"").decode() for k in (1, 2)]
    assert "#" in first[0] + first[1] or any("all_reduce #" in text for text in waiter_files), waiter_files
    assert first[2].startswith(f"every rank (0-3) is in load_next_shard (test_hangs.py:{shard})"), first[2]
    assert first[3].startswith("ranks 0,2-3 wait in Ray Train's report barrier"), first[3]
    assert "rank 1 did not reach it" in first[3] and f"load_next_shard (test_hangs.py:{shard})" in first[3]
    # Several process groups: only the stopped rank is named; the ranks in the default group's
    # all_reduce and its partner in the pair's wait (numbers and groups where recorders came back).
    loss_line, pair_line = line_of(HERE, "loss_all_reduce"), line_of(HERE, "pair_all_reduce")
    assert re.match(
        rf"ranks 0-1 wait in all_reduce( #\d+ of default_pg| #\d+)? \(test_hangs.py:{loss_line}\); "
        rf"rank 2 waits in all_reduce( #\d+ of pair_2_3| #\d+)? \(test_hangs.py:{pair_line}\); "
        rf"rank 3 (never entered|is not in) .*load_next_shard \(test_hangs.py:{shard}\), no progress for \d+ s\.$",
        first[4],
    ), first[4]
    labels = set(node_labels().values())
    for a, (ranks, _) in zip(alerts[::2], [EPISODES[s] for s in sorted(EPISODES)], strict=True):
        for r in ranks:
            assert any(f"rank {r} on {label}" in a["text"] for label in labels), a["text"]
    # Each hang is named within the product's bound after the rank stopped (LATE_S, derived above).
    for episode in range(1, 6):
        print(run_of(backend, name).files[f"hangs/hang-{episode}/verdict.txt"].decode().split("\n\n")[0])
    assert all(t < LATE_S for t in late.values()), (late, LATE_S)

    run = run_of(backend, name)
    tables = run.tables("hangs")
    print("hangs table of hang 1:", *tables[0], sep="\n")
    assert len(tables) == 5
    rows = {row["rank"]: row for row in tables[0]}
    assert sorted(rows) == list(range(WORLD))
    assert rows[3]["state"] == "stopped" and "load_next_shard" in rows[3]["where"]
    assert {rows[r]["state"] for r in (0, 1, 2)} == {"waits"} and {rows[r]["collective"] for r in (0, 1, 2)} == {
        "all_reduce"
    }
    assert all(rows[r]["last_step"] == 2 for r in range(WORLD)), rows  # optimizer steps, counted by the hook
    assert {row["state"] for row in tables[2]} == {"stuck"}
    groups = {row["rank"]: row for row in tables[4]}
    assert [groups[r]["state"] for r in range(WORLD)] == ["waits", "waits", "waits", "stopped"], tables[4]
    assert {groups[r]["group"] for r in (0, 1) if groups[r]["seq"] != -1} <= {"default_pg"}
    assert {groups[2]["group"]} <= ({"pair_2_3"} if groups[2]["seq"] != -1 else {"", "pair_2_3"})
    for episode in range(1, 6):
        files = {f for f in run.files if f.startswith(f"hangs/hang-{episode}/")}
        assert files == {
            f"hangs/hang-{episode}/verdict.txt",
            *(f"hangs/hang-{episode}/rank-{r}.txt" for r in range(WORLD)),
        }
    python_stuck = run.files["hangs/hang-1/rank-3.txt"].decode()
    assert "load_next_shard" in python_stuck
    # Named stacks where the rank's dump thread answered within its wait; faulthandler's otherwise
    # (seen once in CI on a loaded machine: the rank's file says so in a note).
    assert "TrainingThread(" in python_stuck or "no Python-level dump within the wait" in python_stuck
    native_stuck = run.files["hangs/hang-2/rank-2.txt"].decode()
    assert "faulthandler" in native_stuck and "read_from_device" in native_stuck, native_stuck
    if py_spy() is not None:  # the native-stacks extra (the test extra has it): the C function under it
        assert "native frames (py-spy dump --native)" in native_stuck and "rwn_hold_gil" in native_stuck, native_stuck
    assert "all_reduce" in run.files["hangs/hang-1/rank-0.txt"].decode()
    assert run.completes and run.completes[-1].exit_code == 0
    assert_nothing_left()


def restart_loop(config: dict[str, Any]) -> None:
    """Reports a checkpoint a step; rank 1 stops at step 3 of every attempt, in a data function that
    returns once the test writes ``never``."""
    import tempfile

    import ray.train

    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint()
    start = int(Path(checkpoint.path, "step").read_text()) + 1 if checkpoint else 0
    for step in range(start, 6):
        print(said(rank, step))  # the rank's console: a failed attempt's last lines reach the run
        if step == 3 and rank == 1:
            load_next_shard(os.path.join(config["dir"], "never"))
        with tempfile.TemporaryDirectory() as d:
            Path(d, "step").write_text(str(step))
            ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d))


def restart_fit(name: str, tmp_path: Path, failures: int, **options: Any) -> Any:
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    callback = make_callback(
        hang_timeout_s=HANG_TIMEOUT_S, on_hang="restart", sampling_interval_s=SAMPLING_S, **options
    )
    return trainer(
        restart_loop,
        torch=False,
        train_loop_config={"dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "storage"),
            callbacks=[callback],
            failure_config=FailureConfig(max_failures=failures),
        ),
    )


@pytest.mark.smoke  # on every end of the Ray range: ranks armed, beacons read, the verdict, the restart
def test_on_hang_restart_ends_the_hung_attempt_once_and_ray_restarts_it_from_its_checkpoint(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    """Rank 1 stops at step 3 of every attempt (the same data shard, say): the first hang ends the
    attempt and Ray restarts it from the checkpoint of step 2; the second, at the same place, is
    alerted and not ended (two failures left would have ended it twice more); the test then lets
    the rank go on, and the run completes."""
    name = unique("hang-restart")
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(fit=restart_fit(name, tmp_path, failures=2).fit()), daemon=True
    )
    thread.start()
    try:
        wait_until(lambda: len(hang_alerts(backend, name)) >= 2, 240, "the second attempt's hang")
    finally:
        (tmp_path / "never").touch()  # the shard comes after all
    thread.join(timeout=240)
    assert not thread.is_alive() and result["fit"].error is None, result

    run = run_of(backend, name)
    alerts = hang_alerts(backend, name)
    for a in alerts:
        print(f"{a['severity']} {a['title']}\n{a['text']}\n")
    titles = [a["title"] for a in alerts]
    # The restart is no "progress again"; the second hang's end is.
    assert titles[:2] == ["Hang: rank 1 stopped"] * 2 and titles[2].startswith("Hang over: "), titles
    assert len(titles) == 3, titles
    first, second = alerts[0]["text"], alerts[1]["text"]
    assert "on_hang='restart'" in first and "rank 1 did not reach it" in first
    assert "The attempt before this one stopped at the same place in hang 1, which ended it: load_next_shard " in second
    assert "0 reports after the checkpoint its attempt ran from. This attempt is not ended" in second
    assert {"hangs/hang-1/rank-1.txt", "hangs/hang-2/rank-1.txt"} <= set(run.files)
    # Restarted once, from the checkpoint of step 2: every step once, and the run's one end.
    assert [row["step"] for row in run.history if "step" in row] == [0, 1, 2, 3, 4, 5]
    assert [c.exit_code for c in run.completes] == [0]
    # The Logs tab (rank_console="rank0"): the failed attempt's rank 1 lines, from its node, up to
    # where it hung; none of the attempt that recovered (rank 1 healthy there: its lines dropped).
    console = rank_console(run)
    assert [text for _, text in console[1] if text.startswith("rank 1 ")] == [said(1, s) for s in range(4)], console
    assert len({label for label, _ in console[1]}) == 1  # its node's writer (a retry may place rank 1 elsewhere)
    rank0 = [text for _, text in console[0] if text.startswith("rank 0 ")]
    assert rank0 == [said(0, s) for s in (0, 1, 2, 3, 3, 4, 5)], rank0  # live, both attempts
    assert_nothing_left()


def test_with_no_failures_left_fit_raises_naming_the_hang_and_offline_the_folder_keeps_it(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ray_wandb_nodes import cli
    from ray_wandb_nodes._wandb.txlog import read_run

    with offline_backend(tmp_path, monkeypatch) as (wandb_dir, own_backend):
        name = unique("hang-no-failures-left")
        with pytest.raises(Exception, match=r"hang 1 \(ray_wandb_nodes on_hang='restart'\): rank 0 waits") as err:
            restart_fit(name, tmp_path, failures=0, mode="offline").fit()
        assert "load_next_shard" in str(err.value) and "HangError" in str(err.value)
        assert own_backend.requests == []

    (folder,) = (wandb_dir / "ray_wandb_nodes").iterdir()
    index = json.loads((folder / "index.json").read_text())
    assert index["exit_code"] == 1
    (alert,) = [a for a in index["alerts"] if a["kind"] == "hang"]
    assert alert["level"] == "ERROR" and alert["title"] == "Hang: rank 1 stopped"
    (stack_file,) = folder.glob("**/files/hangs/hang-1/rank-1.txt")
    assert "load_next_shard" in stack_file.read_text()
    (primary,) = [w for w in index["writers"] if w["role"] == "primary"]
    (log_path,) = (folder / primary["path"]).glob("**/run-*.wandb")
    log = read_run(str(log_path))
    assert [row["step"] for row in log.history if "step" in row] == [0, 1, 2]
    assert any(row.get("hangs/_type") == "table-file" for row in log.history)
    capsys.readouterr()
    assert cli.main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "ERROR Hang: rank 1 stopped: rank 0 waits in Ray Train's report barrier" in text, text
    assert_nothing_left()


# Rank 0's save before its report (a model to a slow network file system, ``torch.save`` with no
# user code around it), 6 s past the running limit: the polls that would see it (3 x POLL_S) and
# the evidence round that confirms a suspicion while the rank is still in it (a rank in Python
# answers its dump within a second or two, on a loaded machine too), so that a save judged as
# running would be a hang raised and the attempt restarted. Within the checkpointing phase's
# limit (3 x, 12 s) by 2 s: the phase's age counts from its start, so the load before the save
# adds nothing, and what follows the stalled write is a few ms of writing. Rank 1 waits for it
# in Ray's report barrier.
SAVE_S = HANG_TIMEOUT_S + 6.0
SAVES = 4


class StalledFile(io.BytesIO):
    """A file on a network file system under load: its first write stalls ``SAVE_S``. Notes, in
    ``folder``, the phase the rank's node reads from its slot while the save runs."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder, self.stalled = folder, False

    def write(self, data: Any) -> int:
        if not self.stalled:
            self.stalled = True
            from ray_wandb_nodes._hang import armed_rank, read_slots

            armed = armed_rank()
            slots = [s for s in read_slots(armed.beacon.directory) if s.pid == os.getpid()] if armed else []
            Path(self.folder, "save-phase").write_text(slots[0].phase.name if slots else "not armed")
            time.sleep(SAVE_S)  # <stalled_write>
        return super().write(data)


def saving_loop(config: dict[str, Any]) -> None:
    """Reports a step at a time; at step 1 rank 0 saves its model first, to a stalled file."""
    import ray.train
    import torch

    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Linear(64, 64)
    for step in range(SAVES):
        if step == 1 and rank == 0:
            torch.save(model.state_dict(), StalledFile(config["dir"]))
        ray.train.report({"step": step})


def test_a_save_longer_than_the_running_limit_before_its_report_is_no_hang_and_restarts_nothing(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    name = unique("hang-save")
    callback = make_callback(hang_timeout_s=HANG_TIMEOUT_S, on_hang="restart", sampling_interval_s=SAMPLING_S)
    result = trainer(
        saving_loop,
        torch=False,  # torch imported by the train function, after the plugin's set-up: torch.save wrapped then
        train_loop_config={"dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "storage"),
            callbacks=[callback],
            failure_config=FailureConfig(max_failures=1),  # a false hang would restart the attempt
        ),
    ).fit()
    assert result.error is None

    run = run_of(backend, name)
    print(*(f"{a['severity']} {a['title']}\n{a['text']}\n" for a in run.alerts), sep="\n")
    assert [a["title"] for a in run.alerts if "Hang" in a["title"]] == []
    assert (tmp_path / "save-phase").read_text() == "CHECKPOINTING"
    # One attempt: a restart (no checkpoint to resume from) would report from step 0 again.
    assert [row["step"] for row in run.history if "step" in row] == list(range(SAVES))
    assert run.exit_codes == [0]
    assert_nothing_left()


def nccl_detector() -> bool:
    try:
        import ray.train.v2._internal.callbacks.nccl_ras  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not nccl_detector(), reason="Ray's NCCL hang detector is new in Ray 2.60")
def test_rays_nccl_hang_detector_reaches_the_run_as_alerts_and_its_diagnostics_as_files(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's own detector (its real code, on the controller) polls a scripted ``ncclras`` on the
    workers (tests/support/bin/ncclras: one communicator stuck, rank 1 one all_reduce behind):
    its suspicion, its confirmation and the diagnostics it uploads reach the run."""
    from ray.train import RunConfig, ScalingConfig

    from tests.support.training import train_loop

    monkeypatch.setenv("RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR", "1")  # read on the driver, at the trainer
    monkeypatch.setenv("RAY_TRAIN_NCCL_RAS_MIN_POLL_INTERVAL_S", "0.5")
    monkeypatch.setenv("RAY_TRAIN_NCCL_RAS_CONFIRM_DURATION_S", "2")  # 4 frozen polls; Ray's default: 10 min
    name = unique("ray-nccl")
    result = trainer(
        train_loop,
        torch=False,
        train_loop_config={"lr": 0.1, "reports": 24, "step_sleep_s": 0.3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), callbacks=[make_callback(hang_timeout_s=None)]),
    ).fit()
    assert result.error is None  # Ray's default action observes: training goes on

    run = run_of(backend, name)
    alerts = {a["title"]: a for a in run.alerts}
    print(*(f"{a['severity']} {a['title']}: {a['text']}" for a in run.alerts), sep="\n")
    assert alerts["Ray NCCL hang detector: possible hang"]["severity"] == "WARN"
    confirmed = alerts["Ray NCCL hang detector: hang"]
    assert confirmed["severity"] == "ERROR" and "1 of 1 communicators have a collective mismatch" in confirmed["text"]
    assert "Saved into this run's files under hangs/ray-nccl-1/." in confirmed["text"]
    files = {f: run.files[f].decode() for f in run.files if f.startswith("hangs/ray-nccl-1/")}
    print(*files, sep="\n")
    assert "scripted" in files["hangs/ray-nccl-1/nccl_ras/ncclras_report.txt"]
    assert any(f.startswith("hangs/ray-nccl-1/nccl_ras/ncclras_") and f.endswith(".json") for f in files)
    for rank in (0, 1):  # each rank's stacks as Ray took them (py-spy, or Python's frames without it)
        assert "train_loop" in files[f"hangs/ray-nccl-1/stack_traces/rank_{rank}.log"]
    assert run.completes and run.completes[-1].exit_code == 0
    assert_nothing_left()
