"""Long phases on a rank armed in this process (``arm_rank`` with a real beacon, read back from its
slot as the node reads it): the frameworks' evaluation entry points wrapped once, in the
evaluating phase, their values and exceptions as they are, the phase they interrupted taken up
again; ``long_phase`` for the user's own loop; nothing at all where the rank is not armed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import ray_wandb_nodes
from ray_wandb_nodes import _phases
from ray_wandb_nodes._hang import (
    ArmedRank,
    Beacon,
    Phase,
    arm_rank,
    armed_rank,
    disarm_rank,
    in_phase,
    in_report,
    limit_s,
    parse_hang_timeout,
    progress_of,
    read_slots,
    train_starts,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArmedRank]:
    """This process armed as rank 3 of a run, as a train worker is, its train function started."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):  # set back after the test
        monkeypatch.setenv(name, os.environ.get(name, "2000"))
    rank = arm_rank("phases-run", 3, root=tmp_path)
    train_starts()
    try:
        yield rank
    finally:
        disarm_rank()


def phase_read(rank: ArmedRank) -> Phase:
    """The rank's phase as its node reads it: the slot's file."""
    [slot] = [s for s in read_slots(rank.beacon.directory) if s.rank == rank.rank]
    return slot.phase


class Trainer:
    """A framework's class: ``evaluate`` says which phase its node would read while it runs."""

    calls = 0

    def evaluate(self, rank: ArmedRank | None, fail: bool = False) -> Any:
        Trainer.calls += 1
        seen = phase_read(rank) if rank is not None else None
        if fail:
            raise KeyError("the framework's own error")
        return {"seen": seen, "self": self}

    def train(self) -> str:
        return "not wrapped"


@pytest.fixture
def framework() -> Iterator[ModuleType]:
    module = ModuleType("fake_framework")
    cls = type("Trainer", (Trainer,), {"evaluate": Trainer.evaluate, "train": Trainer.train})
    module.Trainer = cls  # type: ignore[attr-defined]
    yield module


def test_long_phase_names_what_it_takes(framework: ModuleType) -> None:
    for wrong in ("eval", "", "running", 2, None, Phase.EVALUATING):
        with pytest.raises(ValueError) as err:
            ray_wandb_nodes.long_phase(wrong)  # type: ignore[arg-type]
        assert str(err.value) == f'long_phase(kind={wrong!r}): expected "evaluating" or "checkpointing"'
    assert "long_phase" in ray_wandb_nodes.__all__ and ray_wandb_nodes.long_phase is _phases.long_phase


def test_not_armed_nothing_happens(framework: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    assert armed_rank() is None
    with ray_wandb_nodes.long_phase("evaluating"), ray_wandb_nodes.long_phase(" Checkpointing "):
        pass  # outside Ray: no rank, no error
    _phases.WrapMethods("Trainer", ("evaluate",))(framework)

    def never(*_: Any) -> Any:
        raise AssertionError("the phase was entered on a rank that is not armed")

    monkeypatch.setattr(_phases, "in_phase", never)
    trainer = framework.Trainer()
    assert trainer.evaluate(None) == {"seen": None, "self": trainer}
    with pytest.raises(KeyError, match="the framework's own error"):
        trainer.evaluate(None, fail=True)


def test_an_entry_point_runs_in_the_evaluating_phase_wrapped_once(armed: ArmedRank, framework: ModuleType) -> None:
    original = framework.Trainer.__dict__["evaluate"]
    patch = _phases.WrapMethods("Trainer", ("evaluate", "predict"))  # predict: not in this release
    patch(framework)
    patch(framework)  # twice: wrapped once
    wrapped = framework.Trainer.__dict__["evaluate"]
    assert wrapped is not original and wrapped.__wrapped__ is original and wrapped.__name__ == "evaluate"
    assert framework.Trainer.train is Trainer.train and "predict" not in framework.Trainer.__dict__
    _phases.WrapMethods("Missing", ("run",))(framework)  # a class this release lacks: left alone

    trainer = framework.Trainer()
    before = Trainer.calls
    assert trainer.evaluate(armed) == {"seen": Phase.EVALUATING, "self": trainer}
    assert Trainer.calls == before + 1 and phase_read(armed) is Phase.RUNNING
    with pytest.raises(KeyError, match="the framework's own error") as err:
        trainer.evaluate(armed, fail=True)
    assert type(err.value) is KeyError and phase_read(armed) is Phase.RUNNING


def test_the_phase_it_interrupted_is_taken_up_again(armed: ArmedRank) -> None:
    evaluating = ray_wandb_nodes.long_phase("evaluating")
    with in_report():
        with in_phase(Phase.CHECKPOINTING):
            with ray_wandb_nodes.long_phase("evaluating"):
                assert phase_read(armed) is Phase.EVALUATING
            assert phase_read(armed) is Phase.CHECKPOINTING  # an evaluation inside a checkpoint
        assert phase_read(armed) is Phase.IN_REPORT
        with pytest.raises(OSError), evaluating:
            raise OSError("a data error in the evaluation")
        assert phase_read(armed) is Phase.IN_REPORT  # an evaluation inside Ray's report
    assert phase_read(armed) is Phase.RUNNING
    with ray_wandb_nodes.long_phase("evaluating"):
        with in_report():  # a report from inside an evaluation (a callback of the user's own)
            assert phase_read(armed) is Phase.IN_REPORT
        assert phase_read(armed) is Phase.EVALUATING
    assert phase_read(armed) is Phase.RUNNING
    [slot] = read_slots(armed.beacon.directory)
    assert slot.reports == 2


def test_an_evaluation_before_the_first_step_leaves_the_first_step_its_own_limit(tmp_path: Path) -> None:
    """Lightning's sanity check: the time before the first progress counts again from its end,
    still judged as before a first step (3 x); once progress came, a phase is progress."""
    beacon = Beacon(tmp_path, 0)
    try:
        with beacon.in_phase(Phase.EVALUATING):
            [slot] = read_slots(tmp_path)
            assert slot.phase is Phase.EVALUATING and not slot.started
            entered = slot.start_ns
            time.sleep(0.02)
        [slot] = read_slots(tmp_path)
        assert slot.phase is Phase.RUNNING and not slot.started and slot.start_ns > entered
        progress = progress_of(slot, slot.start_ns + 10**9)
        assert progress.age_s == 1.0
        fixed = parse_hang_timeout(5)
        assert limit_s(fixed, cadence_s=None, started=progress.started, phase=progress.phase) == 15.0
        beacon.step()
        with beacon.in_phase(Phase.EVALUATING):
            [slot] = read_slots(tmp_path)
            assert slot.started and slot.last_progress_ns == slot.phase_since_ns  # entering it is progress
    finally:
        beacon.close()


def test_the_installed_frameworks_entry_points_are_wrapped_imported_before_or_after(tmp_path: Path) -> None:
    """In a fresh process (a train worker): Lightning imported before the set-up, transformers and
    pytorch_lightning after; every entry point of this release wrapped once, none missing."""
    missing = [name for name in ("transformers", "lightning", "pytorch_lightning") if find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} (the test extra)")
    code = """
import sys
import lightning.pytorch
from ray_wandb_nodes import _phases, _on_import
_phases.hook_evaluation()
_phases.hook_evaluation()
assert "transformers.trainer" not in sys.modules and "pytorch_lightning" not in sys.modules
import transformers, pytorch_lightning.loops
from transformers import Trainer
import pytorch_lightning.loops.evaluation_loop, pytorch_lightning.loops.prediction_loop
for module, cls, methods in _phases.ENTRY_POINTS:
    owner = getattr(sys.modules[module], cls)
    for name in methods:
        method = owner.__dict__[name]
        assert getattr(method, _phases.MARK), (module, cls, name)
        assert not getattr(method.__wrapped__, _phases.MARK, False), (module, cls, name)
print(_on_import.awaited(), transformers.__version__, lightning.__version__)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "[]", out.stdout
