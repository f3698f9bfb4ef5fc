"""Which GPUs a run judges (only those its ranks hold: not another job's on a shared node, not a
CPU-only job's node, not an observed node's) and when the idle rule speaks (not before the
ranks' first report, not over a checkpoint save the reports show)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._gpu_ids import GpuSlots, gpu_slots, slots_as_ids, visible_gpu_ids
from ray_wandb_nodes._health import COLUMNS, GPU_COLUMNS, HealthMonitor, HealthOptions
from tests.support.fakes import H100, Job, clocks, gpus, inventory, job_names, summary


def test_another_job_s_gpus_on_a_shared_node_are_not_judged_and_an_observed_node_s_neither() -> None:
    # a and b: 8 GPUs each, the run's ranks on GPUs 0-3; c hosts no rank (nodes="cluster").
    # b's GPU 5 throttles, GPU 6 gets uncorrectable errors and GPU 7 falls off; c's GPU 0 too.
    job = Job(
        {"a": (8, (0, 1, 2, 3), H100), "b": (8, (4, 5, 6, 7), H100), "c": (1, (), H100)},
        rank_gpus={r: (str(r % 4),) for r in range(8)},
    )
    alerts = []
    for step in range(8):
        bad = clocks(8, g5=600.0)
        bad[6] = bad[6]._replace(ecc_u=0.0 if step < 2 else float(step))
        lost = step >= 2
        utils = {"a": [97.0] * 8, "b": [97.0] * (7 if lost else 8), "c": [] if lost else [97.0]}
        ints = {"a": clocks(8), "b": {i: v for i, v in bad.items() if not (lost and i == 7)}, "c": {}}
        if not lost:
            ints["c"] = clocks(1)
        alerts += job.sample(utils, ints).alerts
    assert alerts == []
    rows = {(r[0], r[2]): dict(zip(GPU_COLUMNS, r, strict=True)) for r in job.m.gpus.rows(job_names(job))}
    # the table still shows every GPU of the node: the judged ones have ranks, the others none
    assert rows[("node-b-abcdef", 1)]["ranks"] == "5" and rows[("node-b-abcdef", 1)]["state"] == "ok"
    assert {rows[("node-b-abcdef", i)]["ranks"] for i in (5, 6, 7)} == {""}
    assert {rows[("node-b-abcdef", i)]["state"] for i in (5, 6, 7)} == {"ok"}
    table = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in job.m.table()}
    assert table["node-b-abcdef"]["gpus_not_ok"] == ""


def test_another_job_s_gpus_do_not_enter_the_medians() -> None:
    # The run's GPUs at 1980 MHz, one of them at 1300 (< 0.7 x 1980: slow); the other job's 8
    # busy GPUs at 1000 MHz would pull the others' median to 1000, and hide it.
    job = Job({"a": (8, (0, 1, 2, 3), H100), "b": (8, (4, 5, 6, 7), H100)})
    other = {f"g{i}": 1000.0 for i in range(4, 8)}
    alerts = []
    for _ in range(6):
        alerts += job.sample(
            {"a": [97.0] * 8, "b": [97.0] * 8}, {"a": clocks(8, g1=1300.0, **other), "b": clocks(8, **other)}
        ).alerts
    assert [a.title for a in alerts] == ["Slow GPU: node-a-abcdef GPU 1"]
    assert "1300 MHz against 1980 MHz" in alerts[0].text


def test_runs_sharing_a_node_each_judge_their_own_gpus_one_alert_for_one_bad_gpu() -> None:
    # Eight one-GPU runs (Tune trials, each a Train run of one rank) on one 8-GPU node and on a
    # second node each: GPU 3 of the shared node gets uncorrectable errors: one alert, its run's.
    runs = [
        Job({"n": (8, (0,), H100), f"m{k}": (1, (1,), H100)}, rank_gpus={0: (str(k),), 1: ("0",)}, compare_all=True)
        for k in range(8)
    ]
    said: dict[int, list[str]] = {}
    for step in range(6):
        bad = clocks(8)
        bad[3] = bad[3]._replace(ecc_u=0.0 if step < 2 else float(step))
        for k, job in enumerate(runs):
            result = job.sample({"n": [97.0] * 8, f"m{k}": [97.0]}, {"n": bad, f"m{k}": clocks(1)})
            said.setdefault(k, []).extend(a.title for a in result.alerts)
    assert {k: v for k, v in said.items() if v} == {3: ["GPU memory errors: node-n-abcdef GPU 3"]}
    rows = {
        r[2]: dict(zip(GPU_COLUMNS, r, strict=True))
        for r in runs[3].m.gpus.rows(job_names(runs[3]))
        if r[0] == "node-n-abcdef"
    }
    assert rows[3]["ranks"] == "0" and rows[3]["state"] == "memory errors" and rows[4]["ranks"] == ""


def tune_trials(ray_ids: tuple[str, ...] | None = None, held: bool = True) -> list[Job]:
    """Eight one-GPU Tune trials on one 8-GPU node, as the Tune callback feeds their monitors:
    each trial rank 0 of the node, its GPU as Ray's slot there (``held``; else nothing said, as
    for a trial whose GPUs could not be read); the node's reader says Ray's GPU ids there."""
    runs = []
    for k in range(8):
        slots = {0: GpuSlots((k,))} if held else None
        job = Job({"n": (8, (0,) if held else (), H100)}, rank_gpus=slots, compare_all=True, reported=False)
        job.infos["n"] = inventory(8, "n")._replace(ray_ids=ray_ids)
        runs.append(job)
    return runs


def said_by_trials(runs: list[Job], bad_gpu: int) -> dict[int, list[str]]:
    """The alerts of each trial's run while GPU ``bad_gpu`` of the node gets uncorrectable errors."""
    said: dict[int, list[str]] = {}
    for step in range(6):
        bad = clocks(8)
        bad[bad_gpu] = bad[bad_gpu]._replace(ecc_u=0.0 if step < 2 else float(step))
        for k, job in enumerate(runs):
            said.setdefault(k, []).extend(a.title for a in job.sample({"n": [97.0] * 8}, {"n": bad}).alerts)
    return {k: v for k, v in said.items() if v}


def test_eight_one_gpu_tune_trials_on_a_node_give_one_alert_for_one_bad_gpu_the_holder_s() -> None:
    assert said_by_trials(tune_trials(), 3) == {3: ["GPU memory errors: node-n-abcdef GPU 3"]}


def test_a_trial_s_gpu_slots_are_named_by_the_node_s_ray_gpu_ids() -> None:
    # A raylet started under CUDA_VISIBLE_DEVICES=7,6,5,4,3,2,1,0: slot 0 is GPU 7, as Ray names it.
    reversed_ids = tuple(str(i) for i in range(7, -1, -1))
    assert said_by_trials(tune_trials(reversed_ids), 3) == {4: ["GPU memory errors: node-n-abcdef GPU 3"]}
    # A slot past the node's Ray GPU ids: which GPU the trial uses is not known, every GPU is judged.
    assert set(said_by_trials(tune_trials(("0", "1")), 3)) == set(range(2, 8))


def test_a_trial_whose_gpus_are_not_known_judges_its_whole_node_as_before() -> None:
    assert set(said_by_trials(tune_trials(held=False), 3)) == set(range(8))


@pytest.mark.parametrize(
    ("mapping", "slots"),
    [
        ([("GPU", [1])], (1,)),  # a plain actor of one GPU
        ([("CPU", [0]), ("GPU", [0, 3])], (0, 3)),
        # in a placement group (a Tune trial's): the group's and the bundle's resource name the same slot
        ([("bundle_group_1_f5ca", [0]), ("GPU_group_f5ca", [1]), ("GPU_group_1_f5ca", [1])], (1,)),
        ([("CPU_group_f5ca", [0])], ()),  # no GPU
    ],
)
def test_a_trial_s_gpu_slots_are_read_from_its_resource_mapping_as_ray_reads_them(
    mapping: list[tuple[str, list[int]]], slots: tuple[int, ...]
) -> None:
    assert gpu_slots(mapping) == slots


def test_gpu_slots_become_ray_s_gpu_ids_on_their_node() -> None:
    assert slots_as_ids((0, 1), None) == ("0", "1")  # no CUDA_VISIBLE_DEVICES: slot i is GPU i
    assert slots_as_ids((0, 1), ("2", "3")) == ("2", "3")
    assert slots_as_ids((1,), ("GPU-aa", "GPU-bb")) == ("GPU-bb",)
    assert slots_as_ids((2,), ("2", "3")) is None  # past them: not known


def test_a_node_s_ray_gpu_ids_are_the_cuda_visible_devices_its_process_started_under(tmp_path: Any) -> None:
    environ = tmp_path / "environ"  # as /proc/<pid>/environ holds it: what the process started under
    for held, ids in [
        (b"PATH=/bin\0CUDA_VISIBLE_DEVICES=2,3\0", ("2", "3")),
        (b"PATH=/bin\0", None),  # not set: every GPU, slot i is GPU i
        (b"CUDA_VISIBLE_DEVICES=\0", ()),  # no GPU
        (b"CUDA_VISIBLE_DEVICES=GPU-aa,GPU-bb\0", ("GPU-aa", "GPU-bb")),
    ]:
        environ.write_bytes(held)
        assert visible_gpu_ids(str(environ)) == ids, held
    assert visible_gpu_ids(str(tmp_path / "gone")) is None


def test_a_cpu_only_job_on_gpu_nodes_is_judged_by_its_cpu_not_another_job_s_gpus() -> None:
    clock = [1000.0]
    m = HealthMonitor(HealthOptions(window_s=2, table_every_s=1e9), clock=lambda: clock[0])
    names = {n: (f"node-{n}-abcdef", n) for n in "abc"}
    m.set_nodes(names, {"a": (0,), "b": (1,), "c": (2,)}, (), {0: (), 1: (), 2: ()})  # ranks without GPUs
    m.report([])
    alerts = []
    for seq in range(1, 7):  # another job keeps a's and b's GPUs busy, c's idle; the CPUs are alike
        clock[0] += 1
        for n, util in (("a", 97.0), ("b", 96.0), ("c", 0.0)):
            m.summary(
                n, summary(clock[0], seq=seq, cpu=300.0, gpus=gpus([util] * 2), info=inventory(2, n), ints=clocks(2))
            )
        alerts += m.tick().alerts
    assert alerts == []
    table = {r[0]: dict(zip(COLUMNS, r, strict=True)) for r in m.table()}
    assert table["node-c-abcdef"]["value"] == 300.0  # its CPU share, not the other job's 0 %


def idle_job(reported: bool) -> Job:
    return Job({"a": (2, (0, 1), H100), "b": (2, (2, 3), H100)}, reported=reported)


IDLE = {"a": [96.0, 96.0], "b": [0.0, 96.0]}  # rank 2's GPU idle while the others work (in a collective)


def test_no_idle_verdict_before_the_ranks_first_report_then_as_before() -> None:
    job = idle_job(reported=False)  # rank 2 prepares the dataset, the others wait at 100 %
    alerts = []
    for _ in range(6):
        alerts += job.sample(IDLE).alerts
    assert alerts == []
    job.m.report([])  # the first report: set-up is over
    for _ in range(6):
        alerts += job.sample(IDLE).alerts
    assert [a.title for a in alerts] == ["Idle GPU: node-b-abcdef GPU 0"]


def late(job: Job, t0: float, t: float, n: int, utils: dict[str, list[float]]) -> Any:
    """One summary a node's ping brings late (at scale): ``n`` samples from ``t0`` to ``t``."""
    job.seq += n
    for node, (count, _, _) in job.nodes.items():
        job.m.summary(
            node, summary(t, t0=t0, n=n, seq=job.seq, cpu=10.0, gpus=gpus(utils[node]), info=inventory(count, node))
        )


def test_no_idle_verdict_over_a_checkpoint_save_the_reports_show_then_as_before() -> None:
    job = idle_job(reported=True)
    busy = {"a": [96.0, 96.0], "b": [96.0, 96.0]}
    for _ in range(3):
        assert job.sample(busy).alerts == []
    start = job.clock.now
    job.clock.now += 10  # rank 2 saves a checkpoint for 10 s; its samples come after the report
    job.m.report([], checkpoint=True)
    late(job, start + 1, job.clock.now, 10, IDLE)
    assert job.m.tick().alerts == []
    alerts = []
    for _ in range(6):  # idle after the save: the alert as before
        alerts += job.sample(IDLE).alerts
    assert [a.title for a in alerts] == ["Idle GPU: node-b-abcdef GPU 0"]


def on_node_clock(job: Job, skew: dict[str, float], utils: dict[str, list[float]], t0: float | None = None) -> Any:
    """One summary of each node timed on its own clock, ``skew[node]`` seconds off the monitor's,
    sent as its newest sample is taken (``age_s`` 0, as the node measures it): one interval, or
    the samples since ``t0`` (the monitor's clock) that a late ping brings."""
    n = 1 if t0 is None else int(job.clock.now - t0)
    job.seq += n
    for node, (count, _, _) in job.nodes.items():
        off = skew.get(node, 0.0)
        start = None if t0 is None else t0 + off
        job.m.summary(
            node,
            summary(job.clock.now + off, t0=start, n=n, seq=job.seq, cpu=10.0, gpus=gpus(utils[node]),
                    info=inventory(count, node), age_s=0.0),
        )  # fmt: skip
    return job.m.tick()


@pytest.mark.parametrize("skew", [3600.0, -3600.0, 7.5], ids=["an-hour-ahead", "an-hour-behind", "seconds-ahead"])
def test_the_save_window_holds_whatever_a_nodes_clock_says(skew: float) -> None:
    """Reports are timed on the controller's clock, samples on their node's: the window is placed
    by the samples' ages, never by setting the two clocks against each other. Node b's clock off by
    an hour: ahead, its idle samples during the save fell after the window and raised a false
    "Idle GPU"; behind, every sample fell before the ranks' first report and no idle verdict ever
    came. Now neither, and the idle alert after the save still comes."""
    job = idle_job(reported=False)
    busy = {"a": [96.0, 96.0], "b": [96.0, 96.0]}
    skewed = {"b": skew}
    job.clock.now += 1
    on_node_clock(job, skewed, busy)
    job.m.report([])  # the ranks' first report
    for _ in range(3):
        job.clock.now += 1
        assert on_node_clock(job, skewed, busy).alerts == []
    start = job.clock.now
    job.clock.now += 10  # rank 2 saves a checkpoint for 10 s; its samples come after the report
    job.m.report([], checkpoint=True)
    assert on_node_clock(job, skewed, IDLE, t0=start + 1).alerts == []
    alerts = []
    for _ in range(6):  # idle after the save: the alert as before
        job.clock.now += 1
        alerts += on_node_clock(job, skewed, IDLE).alerts
    assert [a.title for a in alerts] == ["Idle GPU: node-b-abcdef GPU 0"]


def test_the_same_late_idle_span_without_a_checkpoint_is_idle() -> None:
    # the control: the save span, not lateness, keeps the verdict back
    job = idle_job(reported=True)
    for _ in range(3):
        job.sample({"a": [96.0, 96.0], "b": [96.0, 96.0]})
    start = job.clock.now
    job.clock.now += 10
    job.m.report([])
    late(job, start + 1, job.clock.now, 10, IDLE)
    assert [a.title for a in job.m.tick().alerts] == ["Idle GPU: node-b-abcdef GPU 0"]


def test_a_restart_s_new_ranks_are_in_set_up_again_until_they_report() -> None:
    job = idle_job(reported=True)
    job.m.set_nodes(job_names(job), {"a": (0, 1), "b": (4, 5)}, (), {0: ("0",), 1: ("1",), 4: ("0",), 5: ("1",)})
    alerts = []
    for _ in range(6):
        alerts += job.sample(IDLE).alerts
    assert alerts == []  # b's ranks are a new worker group's, not reported yet
    job.m.report([])
    for _ in range(6):
        alerts += job.sample(IDLE).alerts
    assert [a.title for a in alerts] == ["Idle GPU: node-b-abcdef GPU 0"]
    assert "rank 4" in alerts[0].text


def test_every_report_reaches_the_run_s_monitor_with_its_checkpoint_without_a_metric_rule() -> None:
    from ray_wandb_nodes._run.session import SharedSession
    from tests.support.fleets import simulated_fleet

    fleet, _, target = simulated_fleet(2)
    assert target.health.options.metric is None  # the default rule: no metric to judge
    seen: list[tuple[int, bool]] = []
    report = target.health.report
    target.health.report = lambda metrics, now=None, checkpoint=False: (
        seen.append((len(metrics), checkpoint)) or report(metrics, now, checkpoint)
    )
    session = SharedSession(target, target.primary, fleet, 1.0)
    session.report_ranks([{"loss": 1.0}, {"loss": 2.0}])
    session.report_ranks([{"loss": 1.0}, {"loss": 2.0}], checkpoint=True)
    while not fleet._commands.empty():
        fleet.step(fleet._commands.get_nowait())
    assert seen == [(0, False), (0, True)]  # the time and the checkpoint; no metrics held without the rule
