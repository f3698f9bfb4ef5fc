"""The GPU rules (slow, idle, memory errors, lost) from tables, the GPU ids Ray gives against
NVML's, and the monitor applying them: which GPU, on which node, under which ranks."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._gpu_ids import lookup_on_node, nvml_indices, nvml_inventory, ray_gpu_ids
from ray_wandb_nodes._health import (
    COLUMNS,
    GPU_COLUMNS,
    GpuInts,
    GpuInventory,
    GpuState,
    gpu_ints,
)
from ray_wandb_nodes._health.gpu_ecc import EccWatch, ecc_step
from ray_wandb_nodes._health.gpu_idle import idle_verdicts
from ray_wandb_nodes._health.gpu_lost import lost_step
from ray_wandb_nodes._health.gpu_slow import slow_verdicts
from ray_wandb_nodes._health.rule import NodeStreak
from ray_wandb_nodes._health.table import TABLE_CAP
from tests.support.fakes import A100, H100, Job, clocks, gpu, job_names
from tests.support.fakes import ints as fake_ints


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        # one throttled H100 among busy ones: below 0.7 x the others' median clock
        ({"a": (H100, 100, 1980), "b": (H100, 100, 1965), "c": (H100, 100, 900)}, {"c"}),
        # a clock under the others' but within the threshold: not slow
        ({"a": (H100, 100, 1980), "b": (H100, 100, 1965), "c": (H100, 100, 1500)}, set()),
        # an idle GPU's low clock is no throttle (it is not compared)
        ({"a": (H100, 100, 1980), "b": (H100, 100, 1965), "c": (H100, 3, 345)}, set()),
        # A100s boost lower than H100s: each model against its own
        ({"a": (H100, 100, 1980), "b": (H100, 100, 1970), "c": (A100, 100, 1410), "d": (A100, 100, 1400)}, set()),
        # ... and a slow A100 among A100s is found beside H100s
        ({"a": (H100, 100, 1980), "c": (A100, 100, 1410), "d": (A100, 100, 1400), "e": (A100, 95, 600)}, {"e"}),
        # a model with a single busy GPU has nothing to compare with
        ({"a": (H100, 100, 1980), "c": (A100, 100, 500)}, set()),
        # a GPU whose SM clock is not known yet is left out; the others still compare
        ({"a": (H100, 100, 1980), "b": (H100, 100, None), "c": (H100, 100, 900)}, {"c"}),
        ({"b": (H100, 100, None), "c": (H100, 100, 900)}, set()),
    ],
)
def test_the_slow_gpu_rule_compares_busy_gpus_of_one_model(gpus: dict[str, Any], expected: set[str]) -> None:
    verdicts = slow_verdicts(gpus, threshold=0.7)
    assert {k for k, (worse, _) in verdicts.items() if worse} == expected


def test_a_slow_gpu_s_verdict_carries_the_others_median() -> None:
    verdicts = slow_verdicts({"a": (H100, 100, 1980), "b": (H100, 100, 1960), "c": (H100, 100, 900)}, 0.7)
    assert verdicts["c"] == (True, 1970.0)


@pytest.mark.parametrize(
    ("utils", "expected"),
    [
        ({"a": 97, "b": 95, "c": 0}, {"c"}),
        ({"a": 97, "b": 95, "c": 5}, {"c"}),  # at most 5 % is idle
        ({"a": 97, "b": 95, "c": 6}, set()),
        ({"a": 30, "b": 20, "c": 0}, set()),  # the others are not busy either: nobody is waited for
        ({"c": 0}, set()),  # alone
        ({"a": 90, "b": 0, "c": 0, "d": 95, "e": 96}, {"b", "c"}),
    ],
)
def test_the_idle_gpu_rule_flags_a_rank_gpu_at_zero_while_the_others_work(
    utils: dict[str, float], expected: set[str]
) -> None:
    assert {k for k, (worse, _) in idle_verdicts(utils).items() if worse} == expected


def test_an_uncorrected_ecc_increase_alerts_at_once_and_once_per_episode() -> None:
    watch = EccWatch()
    # (count, samples, start, end) -> whether an alert is due
    steps = [
        (2, 3, 0, 1, False),  # the baseline: errors from before the run are no alert
        (2, 3, 1, 2, False),
        (3, 1, 2, 2, True),  # up: at once, one sample is enough
        (5, 1, 3, 3, False),  # still rising: the same episode
        (5, 3, 4, 6, False),  # quiet, not for the window yet
        (5, 3, 6, 9, False),  # quiet for the window (3 s, 3 samples): the episode ends
        (6, 1, 10, 10, True),  # a new increase: a new episode
    ]
    said = [ecc_step(watch, c, n, s, e, window_s=3, min_samples=3) for c, n, s, e, _ in steps]
    assert said == [due for *_, due in steps]
    assert watch.ever and watch.last == 6


def test_a_gpu_missing_for_the_window_is_lost_once_and_back_once() -> None:
    streak = NodeStreak()
    batches = [(True, 0), (False, 1), (False, 2), (False, 3), (False, 4), (True, 5), (True, 6), (True, 7), (True, 8)]
    said = [lost_step(streak, present, 1, t, t, window_s=2, min_samples=3) for present, t in batches]
    assert said == [None, None, None, GpuState.LOST, None, None, None, GpuState.OK, None]  # lost, then back


def test_a_block_of_samples_spanning_the_window_is_judged_at_once() -> None:
    # The integer series come a transaction-log block late: one batch of 10 samples over 5 s.
    streak = NodeStreak()
    assert lost_step(streak, False, 10, 100.0, 105.0, window_s=2, min_samples=3) is GpuState.LOST


@pytest.mark.parametrize(
    ("ids", "uuids", "expected"),
    [
        (("0", "3"), None, (0, 3)),
        (("GPU-b", "GPU-a"), ["GPU-a", "GPU-b"], (1, 0)),
        (("GPU-b",), None, None),  # the monitor's UUIDs not known yet
        (("GPU-z",), ["GPU-a"], None),
        (("MIG-1a2b",), ["GPU-a"], None),  # a MIG slice has no index of its own
        ((), None, ()),
    ],
)
def test_ray_gpu_ids_map_to_nvml_indices(ids: tuple[str, ...], uuids: list[str] | None, expected: Any) -> None:
    assert nvml_indices(ids, uuids) == expected


def test_ray_s_accelerator_ids_are_kept_as_strings() -> None:
    assert ray_gpu_ids({"GPU": ["0", 1, "GPU-8f2c"]}) == ("0", "1", "GPU-8f2c")
    assert ray_gpu_ids(None) == () and ray_gpu_ids({"TPU": ["0"]}) == ()


def test_uuids_are_looked_up_in_nvml_on_the_node(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.nvml import LIBRARY, Gpu, ScriptedGpus, build

    gpus = ScriptedGpus(tmp_path / "gpus.txt", [Gpu(), Gpu(), Gpu()], node="x")
    monkeypatch.setenv("SCRIPTED_NVML_GPUS", str(gpus.path))
    library = str(build() / LIBRARY)
    assert lookup_on_node([gpus.gpus[2].uuid, "0"], library) == (2, 0)
    assert lookup_on_node(["GPU-not-there"], library) is None
    assert lookup_on_node(["MIG-1a2b"], library) is None
    assert lookup_on_node(["GPU-x"], str(tmp_path / "no-such-library.so")) is None
    assert nvml_inventory(library) == {"models": [g.name for g in gpus.gpus], "uuids": [g.uuid for g in gpus.gpus]}
    monkeypatch.delenv("SCRIPTED_NVML_GPUS")  # as on a machine without NVIDIA's driver
    assert nvml_inventory(library) is None


def test_a_gpu_off_the_bus_from_the_start_leaves_the_node_s_other_gpus_in_its_inventory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.nvml import LIBRARY, Gpu, ScriptedGpus, build

    gpus = ScriptedGpus(tmp_path / "gpus.txt", [Gpu(), Gpu(name=A100), Gpu()], node="x")
    gpus.set(1, state="lost")  # its handle lookup fails as NVML's does (GPU_IS_LOST)
    monkeypatch.setenv("SCRIPTED_NVML_GPUS", str(gpus.path))
    library = str(build() / LIBRARY)
    uuids = [g.uuid for g in gpus.gpus]
    assert nvml_inventory(library) == {"models": [H100, "", H100], "uuids": [uuids[0], "", uuids[2]]}
    gpus.set_all(state="lost")  # no GPU answers: nothing to list
    assert nvml_inventory(library) is None


def test_the_stand_in_keeps_nvml_s_ecc_counters_apart(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Volatile against aggregate, device memory against SRAM: what a test scripts for each
    counter is what NVML's two ECC calls answer, so a test can tell which one a monitor reads."""
    import ctypes

    from tests.support.nvml import LIBRARY, Gpu, ScriptedGpus, build

    bad = Gpu(ecc_corrected=5, ecc_uncorrected=2, ecc_corrected_aggregate=40, ecc_uncorrected_aggregate=9)
    gpus = ScriptedGpus(tmp_path / "gpus.txt", [bad], node="x")
    gpus.set(0, ecc_uncorrected_sram=3)
    monkeypatch.setenv("SCRIPTED_NVML_GPUS", str(gpus.path))
    nvml = ctypes.CDLL(str(build() / LIBRARY))
    assert nvml.nvmlInit_v2() == 0
    handle, count = ctypes.c_void_p(), ctypes.c_ulonglong()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0

    def counter(error: int, kind: int, location: int) -> int:  # error 1: uncorrected; kind 1: aggregate
        assert nvml.nvmlDeviceGetMemoryErrorCounter(handle, error, kind, location, ctypes.byref(count)) == 0
        return count.value

    def total(error: int, kind: int) -> int:
        assert nvml.nvmlDeviceGetTotalEccErrors(handle, error, kind, ctypes.byref(count)) == 0
        return count.value

    dram, sram = 2, 7
    assert [counter(1, 0, dram), counter(1, 1, dram), counter(1, 0, sram), counter(0, 0, dram)] == [2, 9, 3, 5]
    assert [counter(0, 1, dram), counter(0, 0, sram), total(1, 0), total(1, 1), total(0, 1)] == [40, 0, 5, 12, 40]
    nvml.nvmlShutdown()


# the monitor ------------------------------------------------------------------------------------
def test_a_throttled_gpu_is_one_slow_alert_naming_node_gpu_model_and_ranks_and_no_node_alert() -> None:
    job = Job({"a": (8, tuple(range(8)), H100), "b": (8, tuple(range(8, 16)), H100)})
    alerts = []
    for _ in range(6):
        result = job.sample({"a": [100.0] * 8, "b": [100.0] * 8}, {"a": clocks(8), "b": clocks(8, g3=900.0)})
        alerts += result.alerts
    assert [(a.title, a.level) for a in alerts] == [("Slow GPU: node-b-abcdef GPU 3", "WARN")]
    text = alerts[0].text
    assert f"GPU 3 ({H100}) of node-b-abcdef (host b, rank 11)" in text
    assert "SM clock 900 MHz against 1980 MHz, the median of the job's other busy NVIDIA H100 80GB HBM3 GPUs" in text
    assert "60 C" in text and "500 W of 700 W" in text
    rows = {(r[0], r[2]): dict(zip(GPU_COLUMNS, r, strict=True)) for r in job.m.gpus.rows(job_names(job))}
    assert rows[("node-b-abcdef", 3)]["state"] == "slow" and rows[("node-b-abcdef", 3)]["ranks"] == "11"
    assert rows[("node-a-abcdef", 3)]["state"] == "ok"
    table = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in job.m.table()}
    assert table["node-b-abcdef"]["gpus_not_ok"] == "GPU 3 slow" and table["node-b-abcdef"]["state"] == "ok"
    # back to its clock: one recovery, INFO, once it has held for the hold (a flap is no recovery)
    recovered = []
    for _ in range(5):
        recovered += job.sample({"a": [100.0] * 8, "b": [100.0] * 8}, {"a": clocks(8), "b": clocks(8)}).alerts
    assert recovered == []
    job.clock.now += job.m.options.hold_s
    recovered += job.sample({"a": [100.0] * 8, "b": [100.0] * 8}, {"a": clocks(8), "b": clocks(8)}).alerts
    assert [(a.title, a.level) for a in recovered] == [("Slow GPU recovered: node-b-abcdef GPU 3", "INFO")]


def test_twelve_workers_on_eight_gpu_nodes_judge_each_node_by_its_ranks_gpus() -> None:
    # 8 + 4 ranks: the second node's 4 unused GPUs sit at 0 %, its ranks' GPUs at 97 %.
    job = Job({"a": (8, tuple(range(8)), H100), "b": (8, tuple(range(8, 12)), H100)})
    alerts = []
    for _ in range(6):
        alerts += job.sample({"a": [97.0] * 8, "b": [97.0] * 4 + [0.0] * 4}).alerts
    assert alerts == []  # neither a node straggler nor an idle GPU (the idle ones host no rank)
    table = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in job.m.table()}
    assert table["node-b-abcdef"]["value"] == 97.0
    assert table["node-b-abcdef"]["gpu_util_mean"] == 48.5  # the node's own GPUs, all of them


def test_nodes_of_different_models_are_not_compared_with_each_other() -> None:
    # A100 nodes at 60 % beside H100 nodes at 97 %: each model against its own.
    job = Job({"a": (1, (0,), H100), "b": (1, (1,), H100), "c": (1, (2,), A100), "d": (1, (3,), A100)})
    alerts = []
    for _ in range(6):
        alerts += job.sample({"a": [97.0], "b": [96.0], "c": [60.0], "d": [61.0]}).alerts
    assert alerts == []


def test_an_idle_rank_gpu_is_a_gpu_alert_not_also_a_node_alert() -> None:
    job = Job({"a": (4, (0, 1, 2, 3), H100), "b": (4, (4, 5, 6, 7), H100), "c": (1, (8,), H100)})
    alerts = []
    for _ in range(6):
        alerts += job.sample({"a": [96.0] * 4, "b": [96.0, 0.0, 96.0, 96.0], "c": [97.0]}).alerts
    assert [(a.title, a.level) for a in alerts] == [("Idle GPU: node-b-abcdef GPU 1", "WARN")]
    assert "rank 5" in alerts[0].text and "utilisation 0 %" in alerts[0].text


def test_a_single_gpu_node_whose_gpu_idles_gets_the_gpu_alert_only() -> None:
    job = Job({"a": (1, (0,), H100), "b": (1, (1,), H100), "c": (1, (2,), H100)})
    alerts = []
    for _ in range(6):
        alerts += job.sample({"a": [96.0], "b": [95.0], "c": [0.0]}).alerts
    assert [a.title for a in alerts] == ["Idle GPU: node-c-abcdef GPU 0"]


def test_a_gpu_that_stops_reporting_is_lost_never_slow_and_the_node_goes_on() -> None:
    job = Job({"a": (2, (0, 1), H100), "b": (2, (2, 3), H100)})
    for _ in range(2):
        job.sample({"a": [97.0, 97.0], "b": [97.0, 97.0]}, {"a": clocks(2), "b": clocks(2)})
    alerts = []
    for _ in range(6):  # b's GPU 1 is gone from b's samples; its last clock would look slow
        alerts += job.sample({"a": [97.0, 97.0], "b": [97.0]}, {"a": clocks(2), "b": {0: clocks(1)[0]}}).alerts
    assert [(a.title, a.level) for a in alerts] == [("GPU lost: node-b-abcdef GPU 1", "ERROR")]
    assert "rank 3" in alerts[0].text
    table = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in job.m.table()}
    assert table["node-b-abcdef"]["gpus_not_ok"] == "GPU 1 lost" and table["node-b-abcdef"]["state"] == "ok"
    row = next(
        dict(zip(GPU_COLUMNS, r, strict=True))
        for r in job.m.gpus.rows(job_names(job))
        if r[0:3:2] == ["node-b-abcdef", 1]
    )
    assert row["state"] == "lost" and (row["util"], row["sm_clock"]) == (None, None)  # no stale readings


@pytest.mark.parametrize(
    ("reported", "lost"),
    [
        # MIG for the whole run: NVML answers NOT_SUPPORTED for utilisation, memory/temp/power go on
        (lambda step: gpu(None), False),
        # a healthy GPU whose utilisation read failed once: wandb asks for it no more
        (lambda step: gpu(97.0 if step < 2 else None), False),
        # off the bus: every series stops (wandb's monitor asks a failing GPU nothing more)
        (lambda step: gpu(97.0) if step < 2 else None, True),
    ],
    ids=["mig", "utilisation-stops", "every-series-stops"],
)
def test_a_gpu_is_lost_only_when_every_series_of_it_stops(reported: Any, lost: bool) -> None:
    job = Job({"a": (2, (0, 1), H100), "b": (2, (2, 3), H100)})
    alerts = []
    for step in range(8):  # window 2 s, 3 samples: long enough to be lost four times over
        b1 = reported(step)
        alerts += job.sample({"a": [97.0, 97.0], "b": {0: gpu(97.0), **({1: b1} if b1 else {})}}).alerts
    assert [(a.title, a.level) for a in alerts] == ([("GPU lost: node-b-abcdef GPU 1", "ERROR")] if lost else [])
    rows = {(r[0], r[2]): dict(zip(GPU_COLUMNS, r, strict=True)) for r in job.m.gpus.rows(job_names(job))}
    row = rows[("node-b-abcdef", 1)]
    assert row["state"] == ("lost" if lost else "ok")
    if not lost:  # its other readings still shown
        assert (row["util"], row["memory"], row["temp"], row["power_w"]) == (None, 50.0, 60.0, 500.0)


def test_a_node_whose_gpu_0_was_lost_from_the_start_keeps_its_model_and_per_model_grouping() -> None:
    # A100 nodes at 60 % beside H100 nodes at 97 %; node a's GPU 0 was off the bus when its
    # writer started: NVML named only GPU 1, and wandb reports only GPU 1.
    job = Job({"a": (2, (0,), H100), "b": (1, (1,), H100), "c": (1, (2,), A100), "d": (1, (3,), A100)})
    job.infos["a"] = GpuInventory(("", H100), ("", "GPU-a-1"))
    alerts = []
    for _ in range(6):
        alerts += job.sample({"a": {1: gpu(97.0)}, "b": [96.0], "c": [60.0], "d": [61.0]}).alerts
    assert alerts == []  # each model against its own, as without the lost GPU
    assert job.m.gpus.model("a") == H100


def test_an_uncorrected_ecc_increase_is_one_error_alert_and_the_state_stays() -> None:
    job = Job({"a": (2, (0, 1), H100), "b": (2, (2, 3), H100)})
    bad = clocks(2)
    alerts = []
    for step in range(6):
        bad[0] = bad[0]._replace(ecc_u=0.0 if step < 2 else float(step))  # rising from the third interval
        alerts += job.sample({"a": [97.0, 97.0], "b": [97.0, 97.0]}, {"a": clocks(2), "b": bad}).alerts
    assert [(a.title, a.level) for a in alerts] == [("GPU memory errors: node-b-abcdef GPU 0", "ERROR")]
    assert "uncorrectable" in alerts[0].text and "up from 0" in alerts[0].text and "rank 2" in alerts[0].text
    states = {(r[0], r[2]): r[5] for r in job.m.gpus.rows(job_names(job))}
    assert states[("node-b-abcdef", 0)] == "memory errors" and states[("node-b-abcdef", 1)] == "ok"


def ecc_block(counts: list[float], gpu: int = 0, count: int = 2) -> dict[int, GpuInts]:
    """A log block as the reader reads it, ``gpu``'s uncorrected count at each of its samples."""
    stats = []
    for k, ecc in enumerate(counts):
        items: dict[str, float] = {}
        for i in range(count):
            items.update({f"gpu.{i}.gpu": 97.0, f"gpu.{i}.smClock": 1980.0})
            items[f"gpu.{i}.uncorrectedMemoryErrors"] = ecc if i == gpu else 0.0
        stats.append((100.0 + k, items))
    batch = gpu_ints(stats)
    assert batch is not None
    return dict(batch.by)


def test_errors_inside_a_writers_first_block_are_alerted() -> None:
    # A replacement node: its writer's first block already holds the GPU's new errors (0 at its
    # first sample, 2 at its last). The baseline is the first sample's count, not the block's newest.
    job = Job({"a": (2, (0, 1), H100), "b": (2, (2, 3), H100)})
    alerts = job.sample(
        {"a": [97.0, 97.0], "b": [97.0, 97.0]}, {"a": ecc_block([0.0] * 3), "b": ecc_block([0, 0, 2])}
    ).alerts
    assert [(a.title, a.level) for a in alerts] == [("GPU memory errors: node-b-abcdef GPU 0", "ERROR")]
    assert ": 2, up from 0 when the run first saw it" in alerts[0].text


def test_new_errors_after_a_gpu_reset_are_alerted_below_the_old_maximum() -> None:
    job = Job({"a": (2, (0, 1), H100), "b": (2, (2, 3), H100)})
    alerts = []
    plan = [[5.0] * 3, [5.0] * 3, [5.0] * 3, [0.0] * 3, [0.0] * 3, [0.0, 0.0, 2.0]]  # 5 before the run, a reset, 2 new
    for counts in plan:
        blocks = {"a": ecc_block([0.0] * 3), "b": ecc_block(counts)}
        alerts += job.sample({"a": [97.0, 97.0], "b": [97.0, 97.0]}, blocks).alerts
    assert [a.title for a in alerts] == ["GPU memory errors: node-b-abcdef GPU 0"]
    assert ": 2, up from 0 after its count was reset" in alerts[0].text


def test_an_ecc_count_that_goes_back_down_is_a_new_baseline() -> None:
    watch = EccWatch()
    said = [ecc_step(watch, c, 1, t, t, window_s=3, min_samples=3) for t, c in enumerate([4.0, 4.0, 0.0, 0.0, 1.0])]
    assert said == [False, False, False, False, True]
    assert (watch.base, watch.last, watch.resets) == (0.0, 1.0, 1)


def block_of(samples: list[tuple[float, float]], *, gpu: int = 3, count: int = 8) -> dict[int, GpuInts]:
    """A transaction-log block as the reader reads it: one stats record a sample, ``gpu`` at the
    (utilisation, SM clock) of each sample, the other GPUs busy at 1980 MHz."""
    stats = []
    for k, (util, sm) in enumerate(samples):
        items: dict[str, float] = {}
        for i in range(count):
            items[f"gpu.{i}.gpu"], items[f"gpu.{i}.smClock"] = (util, sm) if i == gpu else (98.0, 1980.0)
        stats.append((100.0 + k, items))
    batch = gpu_ints(stats)
    assert batch is not None
    return dict(batch.by)


def test_a_block_judges_each_clock_with_the_utilisation_of_its_own_sample() -> None:
    by = block_of([(0.0, 300.0), (0.0, 300.0), (98.0, 1980.0)])
    assert by[3].sm == 860.0  # the table's clock: every sample's
    assert (by[3].busy_sm, by[3].busy_util) == (1980.0, 98.0)  # the rule's: the busy sample's
    idle = block_of([(0.0, 300.0)] * 3)
    assert (idle[3].busy_sm, idle[3].busy_util) == (None, None)
    mig = gpu_ints([(1.0, {"gpu.0.smClock": 1980.0})])  # no utilisation (a MIG GPU): never judged
    assert mig is not None and mig.by[0].busy_sm is None


def test_a_gpu_idle_for_part_of_a_block_and_busy_now_is_not_slow() -> None:
    # A checkpoint save or a data stall: GPU 3 idles (and clocks down, as real GPUs do) for most
    # of a block, then works again at full clock: busy now, the block's mean clock low.
    job = Job({"a": (8, tuple(range(8)), H100), "b": (8, tuple(range(8, 16)), H100)})
    alerts = []
    for _ in range(6):
        blocks = {"a": block_of([(98.0, 1980.0)] * 3), "b": block_of([(0.0, 300.0), (0.0, 300.0), (98.0, 1970.0)])}
        alerts += job.sample({"a": [98.0] * 8, "b": [98.0] * 8}, blocks).alerts
    assert alerts == []
    # the same GPU throttled while busy is slow, as before
    for _ in range(6):
        blocks = {"a": block_of([(98.0, 1980.0)] * 3), "b": block_of([(98.0, 900.0)] * 3)}
        alerts += job.sample({"a": [98.0] * 8, "b": [98.0] * 8}, blocks).alerts
    assert [a.title for a in alerts] == ["Slow GPU: node-b-abcdef GPU 3"]
    assert "SM clock 900 MHz against 1980 MHz" in alerts[0].text


def test_the_offline_replay_judges_a_partly_idle_gpu_as_the_live_rules_do() -> None:
    from ray_wandb_nodes.report.gpu_flags import gpu_flags

    def samples(gpu3: list[tuple[float, float]]) -> dict[str, list[tuple[float, dict[str, float]]]]:
        series: dict[str, list[tuple[float, dict[str, float]]]] = {"node-a": [], "node-b": []}
        for k in range(40):
            for label in series:
                values: dict[str, float] = {"cpu": 10.0}
                for i in range(4):
                    util, sm = gpu3[k % len(gpu3)] if (label, i) == ("node-b", 3) else (98.0, 1980.0)
                    values.update({f"gpu.{i}.gpu": util, f"gpu.{i}.smClock": sm, f"gpu.{i}.temp": 60.0})
                series[label].append((1000.0 + 5 * k, values))
        return series

    health = {"threshold": 0.7, "window_s": 20.0}
    assert gpu_flags(samples([(0.0, 300.0), (0.0, 300.0), (98.0, 1970.0)]), health) == {}
    flagged = gpu_flags(samples([(98.0, 900.0)]), health)
    assert list(flagged) == ["node-b"] and "GPU 3" in flagged["node-b"][0] and "is slow" in flagged["node-b"][0]


def test_a_busy_noisy_job_raises_nothing() -> None:
    import random

    rnd = random.Random(7)
    job = Job({n: (8, tuple(range(8 * i, 8 * i + 8)), H100) for i, n in enumerate("abcd")})
    alerts = []
    for _ in range(20):
        utils = {n: [rnd.uniform(88, 100) for _ in range(8)] for n in "abcd"}
        ints = {n: {i: fake_ints(rnd.uniform(1850, 1980)) for i in range(8)} for n in "abcd"}
        alerts += job.sample(utils, ints).alerts
    assert alerts == []


def test_a_mig_node_reporting_no_utilisation_is_not_judged_by_its_cpu() -> None:
    job = Job({"a": (1, (0,), H100), "b": (1, (1,), H100), "c": (1, (2,), H100)})
    for _ in range(3):
        job.sample({"a": [96.0], "b": [95.0], "c": [94.0]})
    alerts = []
    for _ in range(6):  # c now reports GPUs without utilisation (MIG): not a CPU node
        alerts += job.sample({"a": [96.0], "b": [95.0]}).alerts
    assert not [a for a in alerts if a.kind == "straggler"]
    table = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in job.m.table()}
    assert table["node-c-abcdef"]["value"] is None


def test_past_the_table_cap_only_gpus_not_ok_are_listed_and_the_rest_counted() -> None:
    n = TABLE_CAP // 8 + 1
    job = Job({f"n{i}": (8, (i,), H100) for i in range(n)})
    utils = {f"n{i}": [97.0] * 8 for i in range(n)}
    job.sample(utils, {f"n{i}": clocks(8) for i in range(n)})
    utils["n0"] = [97.0] + [97.0] * 7
    for _ in range(5):
        job.sample(utils, {**{f"n{i}": clocks(8) for i in range(n)}, "n0": clocks(8, g0=500.0)})
    rows = job.m.gpus.rows({f"n{i}": (f"node-n{i}", f"n{i}") for i in range(n)})
    assert [(r[0], r[2], r[5]) for r in rows[:-1]] == [("node-n0", 0, "slow")]
    assert rows[-1][0] == f"({8 * n - 1} more GPUs, all ok)"


def test_the_offline_report_flags_gpus_by_the_live_rules() -> None:
    from ray_wandb_nodes.report.gpu_flags import gpu_flags

    def sample(t: float, sm: list[float], ecc_u: list[float], util: float = 97.0) -> tuple[float, dict[str, Any]]:
        values: dict[str, Any] = {"cpu": 5.0}
        for i, (clock, errors) in enumerate(zip(sm, ecc_u, strict=True)):
            values |= {f"gpu.{i}.gpu": util, f"gpu.{i}.smClock": clock, f"gpu.{i}.uncorrectedMemoryErrors": errors}
            values |= {f"gpu.{i}.temp": 70.0, f"gpu.{i}.powerWatts": 300.0, f"gpu.{i}.enforcedPowerLimitWatts": 700.0}
        return t, values

    series = {
        "node-a": [sample(float(t), [1980, 1970], [0, 0]) for t in range(10)],
        # GPU 1 throttles from t=3; GPU 0's uncorrected count goes up at t=5
        "node-b": [sample(t + 0.5, [1975, 1980 if t < 3 else 800], [0 if t < 5 else 4, 0]) for t in range(10)],
    }
    flags = gpu_flags(series, {"threshold": 0.7, "window_s": 2})
    assert set(flags) == {"node-b"}
    assert len(flags["node-b"]) == 2
    slow = next(f for f in flags["node-b"] if f.startswith("GPU 1 is slow"))
    assert "SM clock 800 MHz" in slow and "70 C" in slow
    assert any(f.startswith("GPU 0 reports uncorrectable memory (ECC) errors: 4, up from 0") for f in flags["node-b"])
    assert gpu_flags({"node-a": series["node-a"]}) == {}
