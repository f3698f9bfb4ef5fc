"""What the Train callback says of its workers' set-up on the controller: a rank whose step
anatomy is off (slow ranks not judged) is one warning naming the ranks and why, apart from hang
detection's; ranks armed in full say nothing."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._run import train_workers
from ray_wandb_nodes._run.train_workers import TrainWorkers
from ray_wandb_nodes._warn import Warner
from ray_wandb_nodes._worker.setup import WorkerSetup


class Said(Warner):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[tuple[str, str]] = []

    def warn(self, key: str, message: str) -> None:
        self.said.append((key, message))


def set_up(answers: list[WorkerSetup], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    monkeypatch.setattr(train_workers._ray, "run_on_workers", lambda *args, **kwargs: answers)
    warner = Said()
    workers = TrainWorkers(warner)
    workers.watch("run-1", hangs=True)
    workers.setup(object(), "run-1")
    return warner.said


def test_ranks_without_their_step_anatomy_are_one_warning_naming_them_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "OSError: the slot's region is too small"
    said = set_up([WorkerSetup(0, "armed"), WorkerSetup(1, "armed", why), WorkerSetup(3, "armed", why)], monkeypatch)
    assert said == [(f"steps-arm:{why}", f"slow ranks are not judged: the step anatomy is off on rank(s) 1, 3 ({why})")]


def test_ranks_armed_in_full_or_not_armed_at_all_say_nothing_of_slow_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set_up([WorkerSetup(0, "armed"), WorkerSetup(1, "off")], monkeypatch) == []
    said = set_up([WorkerSetup(0, "armed"), WorkerSetup(1, "no /dev/shm")], monkeypatch)
    assert [key for key, _ in said] == ["hang-arm:no /dev/shm"]  # hang detection's own warning only
