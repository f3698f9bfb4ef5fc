"""The slow rank named live, end to end: a real TorchTrainer over gloo, three ranks on three nodes,
DDP through Ray's ``prepare_model`` and a ``DataLoader`` through ``prepare_data_loader``, no code
of the plugin's in the loop. The node loggers read every rank's step anatomy off its beacon
slot, the fleet judges the ranks, and the alerts, the ``ranks`` table and the history keys reach
the test backend through the real wandb client.

One fit in phases, each switched by the test once the run shows the last one's outcome (the ranks
agree on the phase every step, so that they switch on one step):

1. balanced: the rule judges several windows and names no rank;
2. rank 2's input slowed (its ``collate_fn`` sleeps): one WARN naming rank 2, its node, its input;
3. recovered: one INFO for rank 2;
4. rank 1's forward slowed (it computes, a busy loop: its node's CPU stands out, which the node
   rule alone would call a straggler): one WARN naming rank 1, its node, its compute, and no
   straggler alert for its node (one slow rank, one alert).

Three ranks, not the issue's four: the module shares the suite's ``three_nodes`` cluster (a
cluster of its own was 16 s more, and a fourth rank's torch import on 2 cores another few); the
verdict is the same rule over any count of ranks (the unit tests judge four and more).

Timings (none a pass margin; each wait below is on the run's own outcome): a step is at least
``BASE_S`` (60 ms: past ``_steps.recorder.SLOW_STEP_NS``, 50 ms, every step publishes its region;
scheduling noise on 2 loaded cores stays well under the rule's 30 % of it); a slowed rank adds
``SLOW_S`` (100 ms: about 60 % of its 170 ms step, twice the rule's 30 %). A window needs one of
DDP's timed iterations on every rank (one in 13 on CPU, after its first ten): about 0.8 s
balanced, 2.2 s slowed; the fleet polls every ``HANG_TIMEOUT_S / 16`` (0.75 s). The rule says a
rank after three windows naming it and ``WINDOW_S`` since the first: a flip takes 4 to 8 s here.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import assert_nothing_left
from tests.support.runs import run_of, unique
from tests.support.training import make_callback, trainer
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster
TOPOLOGY = "three_nodes"
WORLD = 3
BASE_S, SLOW_S = 0.06, 0.1
WINDOW_S = 1.0  # straggler_window_s: the rank rule's (and the node rule's) window
HANG_TIMEOUT_S = 12.0  # armed ranks (the step anatomy rides the hang beacon), polled every 0.75 s
SAMPLING_S = 1.0  # the node rule's samples, and the rank history keys at most this often
PHASES = ("balanced", "input", "recovered", "forward", "stop")
INPUT_RANK, FORWARD_RANK = 2, 1
BALANCED_JUDGEMENTS = 4  # history rows of the rule's judgements before the first slowdown
MAX_STEPS = 3000  # a bound should the test die before it stops the loop


def slow_ranks_loop(config: dict[str, Any]) -> None:
    import time

    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    phase_file = Path(config["dir"]) / "phase"
    now = {"phase": "balanced"}

    class Items(Dataset[Any]):
        def __len__(self) -> int:
            return 4 * MAX_STEPS

        def __getitem__(self, index: int) -> Any:
            return torch.ones(16)

    def collate(items: list[Any]) -> Any:  # one call a batch: the loader's fetch
        slowed = now["phase"] == "input" and rank == INPUT_RANK
        time.sleep(BASE_S + (SLOW_S if slowed else 0.0))  # <slow input>
        return torch.stack(items)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def forward(self, x: Any) -> Any:
            if now["phase"] == "forward" and rank == FORWARD_RANK:
                end = time.perf_counter() + SLOW_S
                while time.perf_counter() < end:  # <slow forward>: a busy rank, its node's CPU up
                    pass
            return self.body(x)

    model = ray.train.torch.prepare_model(Net())
    loader = ray.train.torch.prepare_data_loader(DataLoader(Items(), batch_size=4, collate_fn=collate))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    batches = iter(loader)
    for step in range(MAX_STEPS):
        # The phase every rank agrees on (the furthest any rank has read): they switch together.
        wanted = phase_file.read_text().strip() if phase_file.exists() else "balanced"
        agreed = torch.tensor([PHASES.index(wanted)])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        now["phase"] = PHASES[int(agreed)]
        if now["phase"] == "stop":
            break
        loss = model(next(batches)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            ray.train.report({"step": step, "phase": now["phase"]})


def slow_rank_alerts(run: Any) -> list[dict[str, Any]]:
    return [a for a in run.alerts if a["title"].startswith(("Slow rank", "Slow communication"))]


def test_the_slow_rank_is_named_with_its_node_and_cause_and_a_balanced_job_names_none(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    from ray.train import RunConfig, ScalingConfig

    name = unique("slow-ranks")
    callback = make_callback(hang_timeout_s=HANG_TIMEOUT_S, sampling_interval_s=SAMPLING_S, straggler_window_s=WINDOW_S)
    result: dict[str, Any] = {}

    def fit() -> None:
        result["fit"] = trainer(
            slow_ranks_loop,
            torch=True,
            train_loop_config={"dir": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage"), callbacks=[callback]),
        ).fit()

    def said() -> str:
        runs = [r for r in backend.runs.values() if r.display_name == name]
        return "\n".join(f"{a['severity']} {a['title']}: {a['text']}" for r in runs for a in r.alerts)

    def judged() -> int:  # the rule's judgements, as its history keys show them
        runs = [r for r in backend.runs.values() if r.display_name == name]
        return sum("ranks/lateness_ms" in row for r in runs for row in r.history)

    started = time.monotonic()
    switched: dict[str, float] = {}  # phase -> when the test switched to it (the backend's clock)

    def phase(kind: str) -> None:
        print(f"{time.monotonic() - started:6.1f} s: {kind}")
        switched[kind] = time.time()
        (tmp_path / "phase.tmp").write_text(kind)
        (tmp_path / "phase.tmp").replace(tmp_path / "phase")

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    try:
        wait_until(lambda: judged() >= 1, 300, lambda: f"the rule's judgements:\n{said()}")
        print(f"{time.monotonic() - started:6.1f} s: the first judgement")
        wait_until(lambda: judged() >= BALANCED_JUDGEMENTS, 300, lambda: f"the rule's judgements:\n{said()}")
        balanced = slow_rank_alerts(run_of(backend, name))
        phase("input")
        wait_until(lambda: slow_rank_alerts(run_of(backend, name)), 180, lambda: f"rank 2's alert:\n{said()}")
        phase("recovered")
        wait_until(lambda: len(slow_rank_alerts(run_of(backend, name))) >= 2, 180, lambda: f"its end:\n{said()}")
        phase("forward")
        wait_until(lambda: len(slow_rank_alerts(run_of(backend, name))) >= 3, 180, lambda: f"rank 1's:\n{said()}")
    finally:
        phase("stop")
    thread.join(timeout=180)
    assert not thread.is_alive() and result["fit"].error is None, result

    run = run_of(backend, name)
    alerts = slow_rank_alerts(run)
    for a in run.alerts:
        print(f"{a['severity']} {a['title']}\n{a['text']}\n")
    tables = run.tables("ranks")
    print("the first ranks table:", *tables[0], sep="\n")
    print("the last ranks table:", *tables[-1], sep="\n")
    assert balanced == [], balanced  # a balanced job, judged several times: no slow rank

    nodes = {r: label for label, ranks in run.config["ray_train"]["value"]["ranks_by_node"].items() for r in ranks}
    assert sorted(nodes) == list(range(WORLD)) and len(set(nodes.values())) == WORLD, nodes  # a rank a node
    assert [(a["severity"], a["title"]) for a in alerts] == [
        ("WARN", f"Slow rank: rank {INPUT_RANK} on {nodes[INPUT_RANK]}"),
        ("INFO", f"Slow rank recovered: rank {INPUT_RANK} on {nodes[INPUT_RANK]}"),
        ("WARN", f"Slow rank: rank {FORWARD_RANK} on {nodes[FORWARD_RANK]}"),
    ], said()
    assert alerts[0]["text"].startswith(f"Rank {INPUT_RANK} on {nodes[INPUT_RANK]} waits on its input: ")
    assert f"Rank {INPUT_RANK} on {nodes[INPUT_RANK]} keeps pace again" in alerts[1]["text"]
    assert alerts[2]["text"].startswith(f"Rank {FORWARD_RANK} on {nodes[FORWARD_RANK]} is slow to compute")
    for a in alerts:  # no other rank named
        assert not any(f"rank {r} " in a["text"].lower() for r in set(range(WORLD)) - {INPUT_RANK, FORWARD_RANK})
    # One slow rank, one alert: the node rule does not speak of a slow rank's node (nor of its
    # episode's end) once the test slowed that rank. Before, the ranks are balanced and a straggler
    # alert is the node rule's own: its 1 s window (WINDOW_S) judges the CPU of nodes that share
    # one machine's 2 cores, which another test stream's load sets apart now and then (the claims'
    # rule lets such an alert stand: no rank there is named).
    slowed = {nodes[INPUT_RANK]: switched["input"], nodes[FORWARD_RANK]: switched["forward"]}
    spoken = [
        a["title"]
        for a in run.alerts
        for label, since in slowed.items()
        if a["title"].startswith("Straggler") and a["title"].endswith(label) and a["received"] >= since
    ]
    assert not spoken, said()

    # The table: every rank, its node, its parts; the slow rank slow in the one its alert brought.
    assert len(tables) >= 2
    first = {row["rank"]: row for row in tables[0]}
    assert sorted(first) == list(range(WORLD)) and {r: first[r]["node"] for r in first} == nodes
    others = set(range(WORLD)) - {INPUT_RANK}
    assert first[INPUT_RANK]["state"] == "slow" and {first[r]["state"] for r in others} == {"ok"}, tables[0]
    assert first[INPUT_RANK]["input_ms"] >= SLOW_S * 1e3 and first[INPUT_RANK]["lateness_ms"] >= SLOW_S * 1e3 / 2
    last = {row["rank"]: row for row in tables[-1]}
    # Its compute in the last table: the window's mean, whose ends are interpolated between the
    # points its node read (known to a quarter of the window: _steps.marks.GAP_SHARE), so up to
    # that share of a window's steps may be the ones before the slowdown: at least 3/4 of SLOW_S.
    assert last[FORWARD_RANK]["state"] == "slow" and last[FORWARD_RANK]["compute_ms"] >= SLOW_S * 1e3 * 3 / 4
    keys = set().union(*run.history)
    assert {"ranks/lateness_ms", "ranks/input_wait_ms", "ranks/slow"} <= keys
    assert run.completes and run.completes[-1].exit_code == 0
    assert_nothing_left()
