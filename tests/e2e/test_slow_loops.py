"""The slow rank named inside real training loops, end to end on hosts of their own
(``tests/support/hosts.py``: each rank on a host with its own network, hostname and processes):
a real ``TorchTrainer`` over gloo on the CPU, two ranks, no code of the plugin's in the loop.

One fit runs every loop kind one after another, each in two phases, switched by the test once the
run shows the last phase's outcome (the ranks agree on the phase at every step, so they switch on
one step):

- ``fsdp2``: a model sharded with FSDP2's ``fully_shard``; slowed: rank 1's compute (each pass);
- ``fabric``: the same FSDP2 model, no rank slowed; slowed: the link between the two hosts (tc's
  ``htb``, each way, ``SLOW_LINK``): every rank waits in its collectives and none is late, one
  WARN "Slow communication" and, once the link is back, its INFO;
- ``ddp_bn``: a model with BatchNorm under DDP (``prepare_model``: its buffers broadcast at every
  forward); slowed: rank 1's input (its ``collate_fn``);
- ``accum``: DDP with gradient accumulation of ``ACCUMULATE`` (the other micro-batches under
  ``no_sync()``); slowed: rank 1's compute, in every micro-batch;
- ``lightning``: Lightning's ``Trainer`` inside Ray Train (Ray's ``RayDDPStrategy``,
  ``RayLightningEnvironment`` and ``prepare_trainer``; Lightning's fit loop, its data fetcher and
  its DDP, accumulating ``LIGHTNING_ACCUMULATE`` batches a step); slowed: rank 1's
  ``training_step``, in every micro-batch;
- ``hf``: the Hugging Face ``Trainer`` (``prepare_trainer``; Accelerate's own data loader and
  DDP); slowed: rank 1's ``data_collator``.

Each kind's balanced phase comes first: the rule judges ``BALANCED_JUDGEMENTS`` windows of it and
says nothing but the previous kind's recovery; its slowed phase brings one WARN naming rank 1, its
host and the cause. FSDP2 goes first: a process that has run a DDP keeps DDP's totals, and a window
waits for a DDP sample (up to ``_steps.windows.MAX_DDP_HOLD`` steps) once a rank has had one.

Timings (none a pass margin; each wait is on the run's own outcome, its ceiling a bound on a dead
run): a step waits ``BASE_S`` for its input (100 ms: past ``_steps.recorder.SLOW_STEP_NS``, 50 ms,
every step publishes its region; and a step long against scheduling noise: on CI's loaded 2 cores
the two ranks, taking turns arriving late, waited for each other 29 ms a step past the attempt's
pace while the rest of the step grew 16 ms, where a balanced kind is told of slow communication
only once that costs 30 % of its step: past about 55 ms of noise a step here, twice what was
seen); the slowed rank adds ``SLOW_S`` a step (150 ms: about 57 % of its step, twice the rule's
30 %), spread over the micro-batches where they accumulate. The straggler window is
``WINDOW_S``; the rule names a rank after three windows in a row and the window since the first
(4 to 8 s here, as in ``test_slow_ranks``), and says its recovery as soon after.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.hosts import HostCluster, HostSpec
from tests.support.runs import run_of, unique
from tests.support.training import make_callback, trainer
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster
HOSTS = (HostSpec("a", "rwn-loops-a"), HostSpec("b", "rwn-loops-b"))
WORLD, SLOW_RANK = 2, 1
BASE_S, SLOW_S = 0.1, 0.15
ACCUMULATE = 4
WINDOW_S = 1.0  # straggler_window_s: the rank rule's window
HANG_TIMEOUT_S = 12.0  # armed ranks (the step anatomy rides the hang beacon), polled every 0.75 s
SAMPLING_S = 1.0  # the rank history keys (one a judgement) at most this often
KINDS = ("fsdp2", "fabric", "ddp_bn", "accum", "lightning", "hf")  # an input kind last: the last ranks table is its
CAUSE = {
    **{"fsdp2": "compute", "fabric": "network", "ddp_bn": "input", "accum": "compute"},
    **{"hf": "input", "lightning": "compute"},
}
# The fabric kind's link between the two hosts while slowed, each way. FSDP2's collectives move
# about 2 KB a rank each (the first layer's shard), four or more a step: at 8 KB/s over a second a
# step in them (1.7 s seen), against the pace the first kind's FSDP2 sets (seen: 8 ms to 16 ms a step
# here, 9.8 ms on CI's loaded host; 58 % of its step there once): past the rule's twice the pace, and
# past it by far more than 30 % of the step.
SLOW_LINK = "64kbit"
LIGHTNING_ACCUMULATE = 2  # Lightning's accumulate_grad_batches: its own no_sync() path
PHASES = (*(f"{kind}:{part}" for kind in KINDS for part in ("balanced", "slow")), "stop")
BALANCED_JUDGEMENTS = 3  # the rule's judgements of a kind's balanced phase (after any recovery)
# Ceilings, none expected to be reached: the fit's start (hosts' raylets, two ranks importing torch
# on 2 loaded cores, the worker group's 60 s start timeout twice over) and a flip of the rule
# (4 to 8 s: 15 times that for a machine other test streams load).
START_S, FLIP_S = 300, 120


@pytest.fixture(scope="module")
def backend(hosts: HostCluster) -> WandbTestBackend:
    return hosts.backend


def slow_loops(config: dict[str, Any]) -> None:
    import contextlib
    import functools
    import tempfile
    import time

    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    phase_file = Path(config["dir"]) / "phase"
    now = {"phase": PHASES[0]}

    def agree() -> str:  # the phase every rank agrees on (the furthest any has read): one step for all
        wanted = phase_file.read_text().strip() if phase_file.exists() else PHASES[0]
        agreed = torch.tensor([PHASES.index(wanted)])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        now["phase"] = PHASES[int(agreed)]
        return now["phase"]

    def slowed(cause: str) -> bool:
        kind, _, part = now["phase"].partition(":")
        return part == "slow" and rank == SLOW_RANK and CAUSE[kind] == cause

    def within(kind: str) -> bool:
        return now["phase"].startswith(f"{kind}:")

    class Items(Dataset[Any]):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, index: int) -> Any:
            return torch.randn(16)

    def collate(items: list[Any], micro: int = 1) -> Any:  # one call a batch: the loader's fetch
        time.sleep((BASE_S + (SLOW_S if slowed("input") else 0.0)) / micro)  # <slow input>
        return torch.stack(items)

    class Busy(torch.nn.Module):  # a pass's compute (a sleep: the host's clock cannot tell)
        def __init__(self, micro: int) -> None:
            super().__init__()
            self.micro = micro

        def forward(self, x: Any) -> Any:
            if slowed("compute"):
                time.sleep(SLOW_S / self.micro)  # <slow compute>
            return x

    def body(micro: int, norm: bool = False) -> Any:
        middle = torch.nn.BatchNorm1d(64) if norm else torch.nn.ReLU()
        return torch.nn.Sequential(torch.nn.Linear(16, 64), middle, Busy(micro), torch.nn.Linear(64, 1))

    def torch_kind(kind: str) -> None:
        micro = ACCUMULATE if kind == "accum" else 1
        model: Any = body(micro, norm=kind == "ddp_bn")
        if kind in ("fsdp2", "fabric"):
            from torch.distributed.fsdp import fully_shard

            fully_shard(model[0])
            fully_shard(model[3])
            model = fully_shard(model)
        else:
            model = ray.train.torch.prepare_model(model)
        loader = DataLoader(Items(), batch_size=4, collate_fn=functools.partial(collate, micro=micro))
        batches = iter(ray.train.torch.prepare_data_loader(loader))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        while agree() and within(kind):
            for i in range(micro):
                x = next(batches)
                unsynced = kind == "accum" and i < micro - 1
                with model.no_sync() if unsynced else contextlib.nullcontext():
                    model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

    def hf_kind() -> None:
        from ray.train.huggingface.transformers import prepare_trainer
        from transformers import Trainer, TrainerCallback, TrainingArguments

        class Tiny(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body = body(1)

            def forward(self, x: Any, labels: Any = None, **kwargs: Any) -> Any:
                # labels and loss kwargs, as a causal LM's: the Trainer counts the batch's tokens
                # and all-gathers the count after its fetch, before this forward
                return {"loss": (self.body(x) - labels).pow(2).mean()}

        class Phases(TrainerCallback):  # type: ignore[misc]
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                control.should_training_stop = agree() and not within("hf")

        def collator(items: list[dict[str, Any]]) -> dict[str, Any]:
            return {"x": collate([item["x"] for item in items]), "labels": torch.zeros(len(items), 1)}

        class Rows(Dataset[Any]):
            def __len__(self) -> int:
                return 10**6

            def __getitem__(self, index: int) -> Any:
                return {"x": torch.randn(16)}

        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(),
            max_steps=10**6,
            per_device_train_batch_size=4,
            learning_rate=0.001,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
        )
        made = Trainer(model=Tiny(), args=args, train_dataset=Rows(), data_collator=collator, callbacks=[Phases()])
        prepare_trainer(made).train()

    def lightning_kind() -> None:
        import lightning
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

        class Tiny(lightning.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.body = body(LIGHTNING_ACCUMULATE)

            def training_step(self, batch: Any, batch_idx: int) -> Any:
                return self.body(batch).pow(2).mean()

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.001)

        class Phases(lightning.Callback):
            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                trainer.should_stop = bool(agree()) and not within("lightning")

        made = lightning.Trainer(
            max_steps=10**6,
            accumulate_grad_batches=LIGHTNING_ACCUMULATE,
            devices="auto",
            accelerator="cpu",
            strategy=RayDDPStrategy(),
            plugins=[RayLightningEnvironment()],
            callbacks=[Phases()],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
        )
        loader = DataLoader(Items(), batch_size=4, collate_fn=functools.partial(collate, micro=LIGHTNING_ACCUMULATE))
        prepare_trainer(made).fit(Tiny(), train_dataloaders=loader)

    for kind in KINDS:
        if kind == "hf":
            hf_kind()
        elif kind == "lightning":
            lightning_kind()
        else:
            torch_kind(kind)


def slow_rank_alerts(run: Any) -> list[dict[str, Any]]:
    return [a for a in run.alerts if a["title"].startswith(("Slow rank", "Slow communication"))]


def test_the_slow_rank_is_named_inside_each_loop_kind_and_a_balanced_one_names_none(
    hosts: HostCluster, backend: WandbTestBackend, tmp_path: Path
) -> None:
    from ray.train import RunConfig, ScalingConfig

    name = unique("slow-loops")
    callback = make_callback(hang_timeout_s=HANG_TIMEOUT_S, sampling_interval_s=SAMPLING_S, straggler_window_s=WINDOW_S)
    result: dict[str, Any] = {}

    def fit() -> None:
        try:
            result["fit"] = trainer(
                slow_loops,
                torch=True,
                train_loop_config={"dir": str(tmp_path)},
                scaling_config=ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 1}),
                run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage"), callbacks=[callback]),
            ).fit()
        except BaseException as e:  # noqa: BLE001 - reported by the test's waits and its end
            result["fit"] = e

    def runs() -> list[Any]:
        return [r for r in backend.runs.values() if r.display_name == name]

    def said() -> str:
        return "\n".join(f"{a['severity']} {a['title']}: {a['text']}" for r in runs() for a in r.alerts)

    def judged() -> int:  # the rule's judgements, as its history keys show them
        return sum("ranks/lateness_ms" in row for r in runs() for row in r.history)

    def alerts() -> int:
        return sum(len(slow_rank_alerts(r)) for r in runs())

    def until(check: Any, ceiling: float, what: str) -> None:  # the run's outcome, or the fit's end
        wait_until(lambda: check() or "fit" in result, ceiling, lambda: f"{what}:\n{said()}")
        assert "fit" not in result, f"the fit ended before {what}: {result['fit']}\n{said()}"

    started = time.monotonic()
    marks: dict[str, int] = {}  # phase -> the slow-rank alerts the run held when the test switched to it

    host_a, host_b = hosts.hosts["a"], hosts.hosts["b"]

    def phase(kind: str) -> None:
        print(f"{time.monotonic() - started:6.1f} s: {kind}")
        marks[kind] = alerts()
        if kind == "fabric:slow":  # the link between the hosts slowed, both ways
            host_a.shape(host_b.address, SLOW_LINK)
            host_b.shape(host_a.address, SLOW_LINK)
        elif kind.endswith(":balanced") or kind == "stop":
            host_a.unshape()
            host_b.unshape()
        (tmp_path / "phase.tmp").write_text(kind)
        (tmp_path / "phase.tmp").replace(tmp_path / "phase")

    marks[PHASES[0]] = 0
    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    try:
        until(lambda: judged() >= 1, START_S, "the rule's first judgement")
        print(f"{time.monotonic() - started:6.1f} s: the first judgement")
        for i, kind in enumerate(KINDS):
            if i:
                phase(f"{kind}:balanced")
                until(lambda i=i: alerts() >= 2 * i, FLIP_S, f"the recovery of rank {SLOW_RANK} ({KINDS[i - 1]})")
            base = judged()
            until(lambda base=base: judged() >= base + BALANCED_JUDGEMENTS, FLIP_S, f"{kind}'s balanced judgements")
            phase(f"{kind}:slow")
            until(lambda i=i: alerts() >= 2 * i + 1, FLIP_S, f"rank {SLOW_RANK}'s alert ({kind})")
    finally:
        phase("stop")
    thread.join(timeout=180)
    print(f"{time.monotonic() - started:6.1f} s: the fit's end")
    assert not thread.is_alive() and getattr(result.get("fit"), "error", True) is None, result

    run = run_of(backend, name)
    found = slow_rank_alerts(run)
    for a in found:
        print(f"{a['severity']} {a['title']}\n{a['text']}\n")
    nodes = {r: label for label, ranks in run.config["ray_train"]["value"]["ranks_by_node"].items() for r in ranks}
    assert sorted(nodes) == list(range(WORLD)) and len(set(nodes.values())) == WORLD, nodes  # a rank a host
    slow = f"rank {SLOW_RANK} on {nodes[SLOW_RANK]}"
    opening = {"input": f"Rank {SLOW_RANK} on {nodes[SLOW_RANK]} waits on its input: ",
               "compute": f"Rank {SLOW_RANK} on {nodes[SLOW_RANK]} is slow to compute"}  # fmt: skip
    ends = [marks[p] for p in PHASES[1:]] + [len(found)]
    for i, kind in enumerate(KINDS):  # the alerts that came in each phase
        balanced = found[marks[f"{kind}:balanced"] : marks[f"{kind}:slow"]]
        slowed = found[marks[f"{kind}:slow"] : ends[2 * i + 1]]
        before = KINDS[i - 1] if i else None
        recovered = [("INFO", f"Slow rank recovered: {slow}")] if before else []
        if before == "fabric":
            recovered = [("INFO", "Slow communication recovered")]
        assert [(x["severity"], x["title"]) for x in balanced] == recovered, (kind, said())
        if kind == "fabric":  # every rank waits, none is late: no rank named
            assert [(x["severity"], x["title"]) for x in slowed] == [("WARN", "Slow communication")], said()
            assert "no rank arrives late" in slowed[0]["text"] and "times the attempt's pace" in slowed[0]["text"]
            continue
        assert [(x["severity"], x["title"]) for x in slowed] == [("WARN", f"Slow rank: {slow}")], (kind, said())
        assert slowed[0]["text"].startswith(opening[CAUSE[kind]]), (kind, slowed[0]["text"])

    # The ranks tables (at most one a minute, the first with the first alert, and the last at the
    # end): the first, FSDP2's, holds rank 1 slow by its compute; the last, the HF Trainer's, by its input.
    tables = [{row["rank"]: row for row in table} for table in run.tables("ranks")]
    for table in tables:
        print(*table.values(), sep="\n", end="\n\n")
    by_cause = {"input": "input_ms", "compute": "compute_ms"}
    for column in by_cause.values():
        named = [
            t
            for t in tables
            if t[SLOW_RANK]["state"] == "slow"
            and t[SLOW_RANK][column] is not None
            and t[SLOW_RANK][column] - t[1 - SLOW_RANK][column] >= SLOW_S * 1e3 / 2
        ]
        assert named, f"no ranks table with rank {SLOW_RANK} slow by {column}"
    assert all(t[1 - SLOW_RANK]["state"] != "slow" for t in tables)  # no other rank named
    assert run.completes and run.completes[-1].exit_code == 0
