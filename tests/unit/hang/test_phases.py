"""Long phases on a rank armed in this process (``arm_rank`` with a real beacon, read back from its
slot as the node reads it): the frameworks' evaluation entry points wrapped once, in the
evaluating phase, their values and exceptions as they are, the phase they interrupted taken up
again; ``long_phase`` for the user's own loop; nothing at all where the rank is not armed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import ray_wandb_nodes
from ray_wandb_nodes._hang import (
    LONG_PHASES,
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
from ray_wandb_nodes._worker import phases as _phases

REPO = Path(__file__).resolve().parents[3]


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
        assert str(err.value) == f'long_phase(kind={wrong!r}): expected "evaluating", "checkpointing" or "preparing"'
    assert "long_phase" in ray_wandb_nodes.__all__ and ray_wandb_nodes.long_phase is _phases.long_phase


def test_long_phase_preparing_is_a_long_phase_of_its_own(armed: ArmedRank) -> None:
    with ray_wandb_nodes.long_phase("preparing"):  # a download, tokenisation, a compilation
        assert phase_read(armed) is Phase.PREPARING
    assert phase_read(armed) is Phase.RUNNING
    assert Phase.PREPARING in LONG_PHASES


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
    pytorch_lightning after; every evaluation entry point and every framework's save of this
    release wrapped once, none missing (DeepSpeed's, not installed here, awaited)."""
    missing = [name for name in ("transformers", "lightning", "pytorch_lightning") if find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} (the test extra)")
    code = """
import sys
import lightning.pytorch
from ray_wandb_nodes._worker import on_import as _on_import, phases as _phases
_phases.hook_evaluation()
_phases.hook_saves()
_phases.hook_evaluation()
_phases.hook_saves()
assert "transformers.trainer" not in sys.modules and "pytorch_lightning" not in sys.modules
import transformers, pytorch_lightning.loops
from transformers import Trainer
import pytorch_lightning.loops.evaluation_loop, pytorch_lightning.loops.prediction_loop
import pytorch_lightning.trainer.trainer, lightning.fabric.fabric, lightning_fabric.fabric
frameworks = [entry for entry in _phases.SAVE_METHODS if not entry[0].startswith("deepspeed")]
for module, cls, methods in (*_phases.ENTRY_POINTS, *frameworks):
    owner = getattr(sys.modules[module], cls)
    for name in methods:
        method = owner.__dict__[name]
        assert getattr(method, _phases.MARK), (module, cls, name)
        assert not getattr(method.__wrapped__, _phases.MARK, False), (module, cls, name)
assert not [name for name in _on_import.awaited() if name in sys.modules], _on_import.awaited()
print("deepspeed.runtime.engine" in _on_import.awaited(), transformers.__version__, lightning.__version__)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "True", out.stdout


# Saves -------------------------------------------------------------------------------------------
class Saves:
    """A stand-in for a framework's module of saves: an engine whose ``save_checkpoint`` calls the
    library's ``save`` (as Hugging Face's calls ``torch.save``), each noting the phase its node
    reads while it runs; ``fail`` raises the library's own error."""

    def __init__(self, rank: ArmedRank | None) -> None:
        self.module = ModuleType("fake_saves")
        self.seen: list[tuple[str, Phase | None]] = []
        saves = self

        def save(obj: object, where: str = "", fail: bool = False) -> object:
            saves.seen.append(("save", phase_read(rank) if rank else None))
            if fail:
                raise OSError(28, "No space left on device")
            return obj

        class Engine:
            def save_checkpoint(self, obj: object, fail: bool = False) -> tuple[object, object]:
                saves.seen.append(("save_checkpoint", phase_read(rank) if rank else None))
                return self, saves.module.save(obj, fail=fail)

        self.module.save = save  # type: ignore[attr-defined]
        self.module.Engine = Engine  # type: ignore[attr-defined]
        _phases.WrapMethods("Engine", ("save_checkpoint",), Phase.CHECKPOINTING)(self.module)
        _phases.WrapFunctions(("save",))(self.module)


def test_a_save_runs_in_the_checkpointing_phase_returns_and_raises_what_it_does(armed: ArmedRank) -> None:
    saves = Saves(armed)
    state = object()
    assert saves.module.save(state) is state
    assert saves.seen == [("save", Phase.CHECKPOINTING)] and phase_read(armed) is Phase.RUNNING
    with pytest.raises(OSError, match="No space left on device") as err:
        saves.module.save(state, fail=True)
    assert type(err.value) is OSError and err.value.errno == 28 and phase_read(armed) is Phase.RUNNING
    with in_report():  # a save inside Ray's report (its checkpoint written there): the report after it
        saves.module.save(state)
        assert phase_read(armed) is Phase.IN_REPORT
    assert saves.seen[-1] == ("save", Phase.CHECKPOINTING) and phase_read(armed) is Phase.RUNNING


def test_a_save_inside_a_save_or_a_long_phase_leaves_the_outer_phase_as_it_is(armed: ArmedRank) -> None:
    """``torch.save`` inside Hugging Face's ``_save_checkpoint``: one phase, entered and left once
    (no stamp in between: the checkpoint's allowance runs from the outer save's start)."""
    saves = Saves(armed)
    engine = saves.module.Engine()
    state = object()
    entered: list[int] = []
    beacon_phase = armed.beacon.phase

    def counted(phase: Phase) -> None:
        entered.append(phase)
        beacon_phase(phase)

    armed.beacon.phase = counted  # type: ignore[method-assign]
    try:
        assert engine.save_checkpoint(state) == (engine, state)
        assert saves.seen == [("save_checkpoint", Phase.CHECKPOINTING), ("save", Phase.CHECKPOINTING)]
        assert entered == [Phase.CHECKPOINTING, Phase.RUNNING]
        with pytest.raises(OSError):
            engine.save_checkpoint(state, fail=True)  # the inner save fails: both hand back, once
        assert phase_read(armed) is Phase.RUNNING and entered[2:] == [Phase.CHECKPOINTING, Phase.RUNNING]
        with ray_wandb_nodes.long_phase("evaluating"):
            saves.module.save(state)  # predictions saved in an evaluation: still evaluating
        assert saves.seen[-1] == ("save", Phase.EVALUATING)
    finally:
        del armed.beacon.phase


def test_a_save_on_another_thread_runs_beside_training_and_changes_no_phase(armed: ArmedRank) -> None:
    """``async_save``'s upload, Lightning's ``AsyncCheckpointIO``: their thread saves while the
    training thread steps; the rank's phase is the training thread's."""
    saves = Saves(armed)
    done: list[object] = []

    def save_beside() -> None:
        done.append(saves.module.save("state"))

    def train() -> None:  # Ray Train's training thread (the rank was armed on another: this test's)
        armed.beacon.step()
        beside = threading.Thread(target=save_beside)
        beside.start()
        beside.join()
        done.append(saves.module.save("own"))

    training = threading.Thread(target=train)
    training.start()
    training.join()
    assert done == ["state", "own"]
    assert saves.seen == [("save", Phase.RUNNING), ("save", Phase.CHECKPOINTING)]


def test_a_save_on_a_rank_that_is_not_armed_is_the_save_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    assert armed_rank() is None
    saves = Saves(None)
    engine = saves.module.Engine()
    assert engine.save_checkpoint(1) == (engine, 1) and saves.seen == [("save_checkpoint", None), ("save", None)]
    with pytest.raises(OSError):
        saves.module.save(1, fail=True)
    assert saves.module.save.__wrapped__.__name__ == "save" and getattr(saves.module.save, _phases.MARK)


def test_a_beacon_that_fails_never_fails_the_save(armed: ArmedRank) -> None:
    saves = Saves(None)

    def broken(phase: Phase) -> None:
        raise ValueError("mmap closed or invalid")

    armed.beacon.phase = broken  # type: ignore[method-assign]
    try:
        assert saves.module.save("state") == "state"
        with pytest.raises(OSError, match="No space"):
            saves.module.save("state", fail=True)  # the save's own error, not the plugin's
    finally:
        del armed.beacon.phase
    calls: list[Phase] = []
    entered_once = armed.beacon.phase

    def fails_on_leaving(phase: Phase) -> None:
        calls.append(phase)
        if len(calls) > 1:
            raise ValueError("mmap closed or invalid")
        entered_once(phase)

    armed.beacon.phase = fails_on_leaving  # type: ignore[method-assign]
    try:
        assert saves.module.save("state") == "state" and calls == [Phase.CHECKPOINTING, Phase.RUNNING]
    finally:
        del armed.beacon.phase


def test_one_wrapper_a_save_function_where_it_is_defined_and_re_exported() -> None:
    defined, exported = ModuleType("lib.serialization"), ModuleType("lib")

    def save(obj: object) -> object:
        return obj

    defined.save = exported.save = save  # type: ignore[attr-defined]
    _phases.WrapFunctions(("save", "missing"))(exported)  # the re-export patched first
    _phases.WrapFunctions(("save",))(defined)
    _phases.WrapFunctions(("save",))(defined)  # twice: wrapped once
    assert defined.save is exported.save and defined.save.__wrapped__ is save


# What a train worker runs: Ray's set-up arms the rank on its own thread, the train function runs
# on another; each real save (and DeepSpeed's, a stand-in under its module's name: not installed
# here) notes the phase its node reads while it runs.
SAVES_IN_A_WORKER = """
import io, json, sys, tempfile, threading, types
from pathlib import Path
from ray_wandb_nodes._worker import phases as _phases
from ray_wandb_nodes._hang import arm_rank, read_slots, train_starts

root, mode = Path(sys.argv[1]), sys.argv[2]
seen = {}

def phase():
    [slot] = read_slots(armed["rank"].beacon.directory)
    return slot.phase.name

def note(name):
    seen.setdefault(name, phase())

def deepspeed_engine(module):
    class DeepSpeedEngine:
        def save_checkpoint(self, save_dir, tag=None):
            note("DeepSpeedEngine.save_checkpoint")
            return (save_dir, tag)
    module.DeepSpeedEngine = DeepSpeedEngine

if mode == "before":  # imported before the set-up: registered under its names
    for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.engine"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["deepspeed"].runtime = sys.modules["deepspeed.runtime"]
    sys.modules["deepspeed.runtime"].engine = sys.modules["deepspeed.runtime.engine"]
    deepspeed_engine(sys.modules["deepspeed.runtime.engine"])
else:  # imported after it, from files
    package = root / "site" / "deepspeed" / "runtime"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    stand_in = "import sys\\nsys.modules['__main__'].deepspeed_engine(sys.modules[__name__])\\n"
    (package / "engine.py").write_text(stand_in)
    sys.path.insert(0, str(root / "site"))

armed = {}

def set_up():
    armed["rank"] = arm_rank("saves", 0, root=root)
    _phases.hook_saves()
    train_starts()

setup = threading.Thread(target=set_up)
setup.start()
setup.join()
assert "torch" not in sys.modules and "safetensors" not in sys.modules, "the set-up imported torch"
armed["rank"].beacon.step()  # this thread is the training thread from here

import deepspeed.runtime.engine
assert deepspeed.runtime.engine.DeepSpeedEngine().save_checkpoint("dir", tag="t") == ("dir", "t")
seen["after the saves"] = phase()
if mode == "after":
    print(json.dumps(seen))
    raise SystemExit(0)

import torch
import torch.distributed.checkpoint as dcp
import safetensors.torch
from torch.distributed.checkpoint import FileSystemWriter

class Stalls(io.BytesIO):  # a file object: a slow network file system
    def write(self, data):
        note("torch.save")
        return super().write(data)

torch.save({"w": torch.zeros(2)}, Stalls())
assert torch.save is torch.serialization.save

class Tensors(dict):
    def items(self):
        note("safetensors.torch.save_file")
        return super().items()

safetensors.torch.save_file(Tensors(w=torch.zeros(2)), str(root / "a.safetensors"))

class Model(torch.nn.Linear):
    def state_dict(self, *args, **kwargs):
        note("safetensors.torch.save_model")
        return super().state_dict(*args, **kwargs)

safetensors.torch.save_model(Model(2, 1), str(root / "m.safetensors"))

class Stateful:
    def __init__(self, name):
        self.name = name
    def state_dict(self):
        note(self.name)
        return {"w": torch.zeros(2)}
    def load_state_dict(self, state):
        pass

dcp.save({"s": Stateful("dcp.save")}, checkpoint_id=str(root / "dcp"), no_dist=True)
dcp.save_state_dict({"w": torch.zeros(2)}, storage_writer=FileSystemWriter(str(root / "old")), no_dist=True)

release = threading.Event()

class Uploads(FileSystemWriter):  # async_save's upload: on its executor's thread, beside training
    def write_data(self, plan, planner):
        release.wait(30)
        note("async_save's upload")
        return super().write_data(plan, planner)

uploaded = dcp.async_save({"s": Stateful("dcp.async_save")}, storage_writer=Uploads(str(root / "async")), no_dist=True)
seen["after async_save returned"] = phase()
release.set()
uploaded.result(timeout=60)
seen["after the saves"] = phase()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("mode", ["before", "after"])
def test_the_saves_run_in_the_checkpointing_phase_in_a_worker(tmp_path: Path, mode: str) -> None:
    """In a fresh process (a train worker): DeepSpeed's engine imported before the set-up or after
    it; torch's, torch.distributed.checkpoint's and safetensors' saves imported after it (the set-up
    imports neither torch nor safetensors). Each save runs in the checkpointing phase; the upload
    that ``async_save`` runs on its own thread after it returned changes no phase."""
    if mode == "before" and find_spec("safetensors") is None:
        pytest.skip("needs safetensors (the test extra)")
    out = subprocess.run(
        [sys.executable, "-c", SAVES_IN_A_WORKER, str(tmp_path), mode], capture_output=True, text=True, timeout=120,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    expected = {"DeepSpeedEngine.save_checkpoint": "CHECKPOINTING", "after the saves": "RUNNING"}
    if mode == "before":
        expected.update({
            "torch.save": "CHECKPOINTING",
            "safetensors.torch.save_file": "CHECKPOINTING",
            "safetensors.torch.save_model": "CHECKPOINTING",
            "dcp.save": "CHECKPOINTING",
            "dcp.async_save": "CHECKPOINTING",  # its synchronous part: the state dict staged
            "after async_save returned": "RUNNING",
            "async_save's upload": "RUNNING",  # beside training, on the executor's thread
        })  # fmt: skip
    assert seen == expected
