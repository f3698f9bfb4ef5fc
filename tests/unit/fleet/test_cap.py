"""The writer cap: which nodes join the shared run and which are only observed (a table of cases)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._fleet.cap import Membership, choose_members, node_kind, priority

KINDS = {"a": "gpu8", "b": "gpu8", "c": "gpu8", "d": "cpu", "e": "gpu8"}
RANKS = {"a": [0, 1], "b": [2, 3], "c": [4, 5], "d": [], "e": [6, 7]}


def members(wanted: str, cap: int | None, current: str = "", stragglers: str = "") -> Membership:
    order = priority(wanted, kinds=KINDS, ranks=RANKS, stragglers=set(stragglers))
    return choose_members(set(wanted), set(current), cap, order, set(stragglers), KINDS)


CASES: list[tuple[str, dict[str, Any], tuple[str, str]]] = [
    ("no cap: every node is a member", dict(wanted="abcde", cap=None), ("abcde", "")),
    ("below the cap: every node", dict(wanted="abc", cap=4), ("abc", "")),
    ("at the cap: every node", dict(wanted="abcd", cap=4), ("abcd", "")),
    ("past the cap: each kind first, then the lowest ranks", dict(wanted="abcde", cap=3), ("abd", "ce")),
    ("a cap of one: the lowest rank's node", dict(wanted="abcde", cap=1), ("a", "bcde")),
    ("current members stay, whatever comes", dict(wanted="abcde", cap=3, current="ce"), ("ace", "bd")),
    ("a member that left is replaced, each kind first", dict(wanted="abde", cap=3, current="ce"), ("ade", "b")),
    (
        "a straggler outside takes the least-needed member's place",
        dict(wanted="abcde", cap=3, current="abd", stragglers="e"),
        ("ade", "bc"),
    ),
    (
        "never its kind's only member",
        dict(wanted="abcde", cap=2, current="ad", stragglers="e"),
        ("de", "abc"),
    ),
    (
        "no spare place: the straggler stays observed",
        dict(wanted="ad", cap=1, current="d", stragglers="a"),
        ("d", "a"),
    ),
]


@pytest.mark.parametrize(("kwargs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_who_joins_the_run(kwargs: dict[str, Any], expected: tuple[str, str]) -> None:
    got = members(**kwargs)
    assert (sorted(got.members), sorted(got.observers)) == (sorted(expected[0]), sorted(expected[1]))
    assert not got.members & got.observers
    assert got.members | got.observers == set(kwargs["wanted"])  # no node is missing


def test_the_kind_of_a_node_is_its_hardware_shape() -> None:
    assert node_kind({"CPU": 96.0, "GPU": 8.0, "accelerator_type:H100": 1.0, "memory": 1e12}) == "gpu=8/H100 cpu=96"
    assert node_kind({"CPU": 4}) == "gpu=0 cpu=4"
    assert node_kind({}) == "gpu=0 cpu=0"
