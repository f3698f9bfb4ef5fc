"""A run's end waits for the console of the fleet's own node as a step, never as a block: the
primary's finish (``then``) comes after the console's last lines, or after its bound."""

from __future__ import annotations

import threading
import time

from ray_wandb_nodes._fleet.retire import Retirement
from ray_wandb_nodes._warn import Warner


class Console:
    """A tailer asked to finish: ``done`` once its last lines are out; every wait it is asked for."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waits: list[float] = []

    def wait_finished(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.done.wait(timeout)


def retirement(said: list[str]) -> Retirement:
    """A run's end with no node writers: its primary's finish says so in ``said``."""
    return Retirement("run-a", {}, 0.0, 60.0, then=lambda: said.append("finish"), writers_done=threading.Event())


def ending(console: Console, until: float, said: list[str]) -> Retirement:
    r = retirement(said)
    r.console, r.console_until = console, until
    return r


def advance(r: Retirement, final: bool = False) -> bool:
    return r.advance(None, None, Warner(), final=final)  # type: ignore[arg-type] # no writers, nothing offline


def test_the_primary_finishes_once_the_console_has_ended_and_no_step_waits_for_it() -> None:
    said: list[str] = []
    console = Console()
    r = ending(console, time.monotonic() + 3600, said)
    assert advance(r) is True and advance(r) is True  # its lines are not out yet: more to do
    assert said == [] and not r.writers_done.is_set()
    console.done.set()
    assert advance(r) is False
    assert said == ["finish"] and r.writers_done.is_set()
    assert set(console.waits) == {0}  # each step only asked


def test_a_console_that_does_not_end_within_its_bound_leaves_the_primary_to_finish() -> None:
    said: list[str] = []
    console = Console()
    assert advance(ending(console, time.monotonic() - 1, said)) is False
    assert said == ["finish"]


def test_the_final_step_finishes_the_primary_without_the_console() -> None:
    said: list[str] = []
    assert advance(ending(Console(), time.monotonic() + 3600, said), final=True) is False
    assert said == ["finish"]


def test_a_run_end_without_a_console_here_finishes_at_once() -> None:
    said: list[str] = []
    r = retirement(said)
    assert advance(r) is False and said == ["finish"]
