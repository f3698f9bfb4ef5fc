"""Options with a closed set of values: what a user writes, the value the package reads, what each
value implies, and the ``Literal`` the callbacks' signatures show (no cluster, no W&B)."""

from __future__ import annotations

import typing
from enum import Enum
from typing import Any, Literal

import pytest

from ray_wandb_nodes import WandbNodesCallback, WandbNodesTuneCallback
from ray_wandb_nodes._config.options import BY_NAME, OPTIONS, TRAIN, TUNE, build_options
from ray_wandb_nodes._config.values import (
    ConsoleMode,
    EgressMode,
    Mode,
    NodeSelection,
    OnHang,
    RankMetrics,
    RunsPer,
    StragglerMode,
    Strategy,
    literal,
    spellings,
)
from ray_wandb_nodes._wandb.writers import Role
from ray_wandb_nodes.offline.storage import Transfer

CLASSES = {TRAIN: WandbNodesCallback, TUNE: WandbNodesTuneCallback}

# Each option with a closed set of values (``mode`` aside: it also takes wandb's spellings and
# ``WANDB_MODE``), the enum it is parsed into, and the member its default is.
CLOSED: dict[str, tuple[type[Enum], Enum]] = {
    "strategy": (Strategy, Strategy.SHARED),
    "rank_metrics": (RankMetrics, RankMetrics.RANK0),
    "rank_console": (ConsoleMode, ConsoleMode.RANK0),
    "nodes": (NodeSelection, NodeSelection.WORKERS),
    "straggler_mode": (StragglerMode, StragglerMode.MAX),
    "on_hang": (OnHang, OnHang.ALERT),
    "offline_transfer": (Transfer, Transfer.AUTO),
    "egress": (EgressMode, EgressMode.DIRECT),
}
SPELLINGS = [(name, member) for name, (choices, _) in CLOSED.items() for member in choices]


def test_every_option_of_a_closed_set_is_in_this_table() -> None:
    closed = {o.name for o in OPTIONS if o.annotation.startswith("Literal[") and " | " not in o.annotation}
    assert closed == set(CLOSED)
    assert all(BY_NAME[name].annotation == literal(choices) for name, (choices, _) in CLOSED.items())
    assert BY_NAME["mode"].annotation == f"{literal(Mode)} | None"


# parsing: what a user writes -------------------------------------------------------------------------


@pytest.mark.parametrize(("option", "member"), SPELLINGS, ids=lambda v: getattr(v, "value", v))
def test_each_value_a_user_writes_becomes_its_member(option: str, member: Enum) -> None:
    assert getattr(build_options(**{option: member.value}), option) is member
    callback = TRAIN if TRAIN in BY_NAME[option].callbacks else TUNE
    built = CLASSES[callback](project="p", mode="disabled", **{option: member.value})
    assert getattr(built.options, option) is member


@pytest.mark.parametrize("option", sorted(CLOSED))
def test_each_default_is_its_member_and_the_signature_writes_its_spelling(option: str) -> None:
    _, default = CLOSED[option]
    assert getattr(build_options(), option) is default
    assert BY_NAME[option].default == default.value


@pytest.mark.parametrize("option", sorted(CLOSED))
@pytest.mark.parametrize("value", ["Shared", " all", "", 1, None, ["workers"]], ids=repr)
def test_a_value_outside_the_set_is_named_with_every_value_allowed(option: str, value: Any) -> None:
    # Spelled exactly as listed: case and spaces count, as they always did for these options.
    choices, _ = CLOSED[option]
    allowed = ", ".join(repr(s) for s in spellings(choices))
    with pytest.raises(ValueError) as info:
        build_options(**{option: value})
    assert str(info.value) == f"ray_wandb_nodes: invalid {option}={value!r}; expected one of {allowed}"


def test_a_member_itself_is_no_spelling() -> None:
    # The enums are the package's own: a user writes the strings the signature lists.
    with pytest.raises(ValueError, match=r"invalid strategy=<Strategy.MAIN: 'main'>; expected one of 'shared'"):
        build_options(strategy=Strategy.MAIN)


@pytest.mark.parametrize(
    ("value", "member"),
    [("online", Mode.ONLINE), ("offline", Mode.OFFLINE), ("disabled", Mode.DISABLED),
     ("OFFLINE", Mode.OFFLINE), (" Disabled ", Mode.DISABLED),  # any case, spaces around
     ("dryrun", Mode.OFFLINE), ("run", Mode.ONLINE)],  # wandb's own spellings
)  # fmt: skip
def test_mode_takes_its_values_in_any_case_and_wandbs_spellings(value: str, member: Mode) -> None:
    assert build_options(mode=value).mode is member
    assert build_options(env_mode=value).mode is member  # WANDB_MODE, when the option is None


@pytest.mark.parametrize(
    ("value", "says"),
    [("shared", "expected one of online, offline, disabled (shared mode is what the plugin uses underneath"),
     ("fast", "expected one of online, offline, disabled"),
     (3, "expected one of online, offline, disabled")],
)  # fmt: skip
def test_a_mode_outside_the_set_is_named_with_every_value_allowed(value: Any, says: str) -> None:
    with pytest.raises(ValueError) as info:
        build_options(mode=value)
    assert str(info.value).startswith(f"ray_wandb_nodes: invalid mode={value!r}; {says}")


# what each value implies ------------------------------------------------------------------------------

# strategy -> (a primary on the driver side, node writers joining its run, runs of their own, hangs watched)
STRATEGY_IMPLIES = {
    Strategy.SHARED: (True, True, None, True),
    Strategy.MAIN: (True, False, None, False),
    Strategy.NODE: (False, False, RunsPer.NODE, False),
    Strategy.ALL: (False, False, RunsPer.RANK, False),
}


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
def test_what_each_strategy_implies(strategy: Strategy) -> None:
    implied = (strategy.primary, strategy.node_writers, strategy.runs_per, strategy.watches_hangs)
    assert implied == STRATEGY_IMPLIES[strategy]


def test_a_strategy_has_a_primary_or_runs_of_its_own_never_both() -> None:
    assert all(s.primary == (s.runs_per is None) for s in Strategy)
    assert all(s.primary for s in Strategy if s.node_writers)  # node writers join the primary's run


@pytest.mark.parametrize(
    ("value", "implied"),
    [(RankMetrics.RANK0, False), (RankMetrics.REDUCE, True), (RankMetrics.ALL, True),  # every_rank
     (OnHang.ALERT, False), (OnHang.RESTART, True),  # ends_attempt
     (StragglerMode.MAX, True), (StragglerMode.MIN, False),  # higher_is_better
     (Mode.ONLINE, True), (Mode.OFFLINE, True), (Mode.DISABLED, False),  # logs
     (Role.PRIMARY, True), (Role.NODE, True), (Role.RUN, False), (Role.OBSERVER, False)],  # joins_shared_run
    ids=repr,
)  # fmt: skip
def test_what_each_other_value_implies(value: Enum, implied: bool) -> None:
    asked = {
        RankMetrics: "every_rank", OnHang: "ends_attempt", StragglerMode: "higher_is_better", Mode: "logs",
        Role: "joins_shared_run",
    }[type(value)]  # fmt: skip
    assert getattr(value, asked) is implied


def test_the_roles_are_what_an_offline_runs_index_names() -> None:
    # index.json (read by `ray-wandb-nodes report` and `sync`) names a writer by these words.
    assert spellings(Role) == ("primary", "node", "run", "observer")


# the signatures -------------------------------------------------------------------------------------------


def test_literal_writes_an_enum_as_the_signature_does() -> None:
    assert literal(NodeSelection) == 'Literal["workers", "cluster"]'


@pytest.mark.parametrize("callback", [TRAIN, TUNE])
def test_the_signatures_name_the_values_each_option_takes(callback: str) -> None:
    hints = typing.get_type_hints(CLASSES[callback].__init__)
    for option, (choices, _) in CLOSED.items():
        if callback in BY_NAME[option].callbacks:
            assert typing.get_origin(hints[option]) is Literal, option
            assert typing.get_args(hints[option]) == spellings(choices), option
    assert set(typing.get_args(hints["mode"])) == {Literal["online", "offline", "disabled"], type(None)}
    if callback == TRAIN:
        assert set(typing.get_args(hints["hang_timeout_s"])) == {float, Literal["auto"], type(None)}
