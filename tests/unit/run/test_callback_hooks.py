"""Every hook of each callback is defined in its class: none is a function of the module
assigned into it (which a line limit once invited), so a reader finds each hook where Ray calls it."""

from __future__ import annotations

import inspect

import pytest
from ray.tune import Callback as TuneCallback

from ray_wandb_nodes import WandbNodesCallback, WandbNodesTuneCallback
from ray_wandb_nodes._ray import train_callback_bases


def hooks(cls: type, bases: tuple[type, ...]) -> list[str]:
    """The hooks ``cls`` implements: the methods of Ray's callback ``bases`` (and theirs) it defines itself."""
    ray_classes = {c for base in bases for c in base.__mro__ if c is not object}
    names = {name for c in ray_classes for name, value in vars(c).items() if inspect.isfunction(value)}
    return sorted(name for name in names if not name.startswith("__") and name in vars(cls))


@pytest.mark.parametrize(
    ("cls", "bases"),
    [(WandbNodesCallback, train_callback_bases()), (WandbNodesTuneCallback, (TuneCallback,))],
    ids=["train", "tune"],
)
def test_every_hook_is_defined_in_its_class(cls: type, bases: tuple[type, ...]) -> None:
    implemented = hooks(cls, bases)
    assert len(implemented) >= 5, implemented  # the lifecycle hooks at least: a check that sees them
    for name in implemented:
        function = inspect.unwrap(vars(cls)[name])  # past @guarded
        assert function.__qualname__ == f"{cls.__name__}.{name}", f"{name} is {function.__qualname__}"
        assert function.__module__ == cls.__module__, name
