"""The tests' one wait helper: it returns what the check found, or fails naming what it awaited."""

from __future__ import annotations

import itertools

import pytest

from tests.support.wait import wait_until


def test_it_returns_the_first_true_value_the_check_gives() -> None:
    values = iter([0, [], {"rows": 3}])
    assert wait_until(lambda: next(values), 5, "rows", every_s=0) == {"rows": 3}


def test_on_timeout_it_names_what_it_awaited_and_the_last_value_seen() -> None:
    counter = itertools.count()
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for three reports; last seen: \[\]"):
        wait_until(lambda: [] if next(counter) >= 0 else None, 0.05, "three reports", every_s=0.01)


def test_a_callable_description_is_asked_at_the_end() -> None:
    state = {"seen": 0}

    def check() -> bool:
        state["seen"] += 1
        return False

    with pytest.raises(AssertionError, match=r"waiting for the run \(seen \d+ times\); last seen: False"):
        wait_until(check, 0.05, lambda: f"the run (seen {state['seen']} times)", every_s=0.01)
    assert state["seen"] >= 2
