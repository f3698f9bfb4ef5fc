"""Past W&B's writers a run: which nodes join the shared run, which are only watched (pure).

W&B tests one shared run with about 300 concurrent writers. A run's node writers are capped at
``max_node_writers``; past the cap the run stays useful and honest:

- the *members* (at most the cap) join the run, so their full series are in it;
- every other node gets an *observer*: a writer of its own, offline, whose samples only feed the
  node table and the straggler rule (its latest summary is in the ``nodes`` table every minute),
  so no node is silently missing; one warning says how many nodes are observed only.

Members are chosen to be worth their place and to stay put (a member is never swapped out for an
ordinary node): stragglers first (the node a user will want to look at), then one node of each
distinct kind (hardware shape: GPUs, accelerator type, CPUs), then the nodes of the lowest ranks,
then by node id. A straggler outside the members takes the place of the least-needed member
(not a straggler, not its kind's only one).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MAX_NODE_WRITERS = 256


@dataclass(frozen=True)
class Membership:
    members: frozenset[str]
    observers: frozenset[str]


def priority(
    nodes: Iterable[str],
    *,
    kinds: Mapping[str, str],
    ranks: Mapping[str, Sequence[int]],
    stragglers: Collection[str] = (),
) -> list[str]:
    """``nodes`` from the most to the least worth a member's place."""
    by_rank = sorted(nodes, key=lambda n: (min(ranks.get(n, ()), default=1 << 62), n))
    first_of_kind: dict[str, str] = {}
    for node in by_rank:
        first_of_kind.setdefault(kinds.get(node, ""), node)
    representatives = set(first_of_kind.values())

    def tier(node: str) -> int:
        return 0 if node in stragglers else 1 if node in representatives else 2

    return sorted(by_rank, key=tier)  # stable: within a tier, by lowest rank then id


def choose_members(
    wanted: Collection[str],
    current: Collection[str],
    cap: int | None,
    order: Sequence[str],
    stragglers: Collection[str] = (),
    kinds: Mapping[str, str] | None = None,
) -> Membership:
    """The members (at most ``cap``) and observers among ``wanted`` nodes.

    ``current`` are the members now (kept while wanted), ``order`` the nodes by
    :func:`priority`; ``cap`` None: every wanted node is a member.
    """
    wanted_set = set(wanted)
    if cap is None or len(wanted_set) <= cap:
        return Membership(frozenset(wanted_set), frozenset())
    members = [n for n in order if n in wanted_set and n in current][:cap]
    ranked = [n for n in order if n in wanted_set]
    for node in ranked:
        if len(members) >= cap:
            break
        if node not in members:
            members.append(node)
    # A straggler outside takes the place of the least-needed member.
    kinds = kinds or {}
    for node in (n for n in ranked if n in stragglers and n not in members):
        spare = _least_needed(members, ranked, stragglers, kinds, kinds.get(node, ""))
        if spare is None:
            break
        members[members.index(spare)] = node
    chosen = frozenset(members)
    return Membership(chosen, frozenset(wanted_set - chosen))


def _least_needed(
    members: list[str], ranked: list[str], stragglers: Collection[str], kinds: Mapping[str, str], newcomer: str
) -> str | None:
    """The member to give way: not a straggler, and not its kind's only one (unless the newcomer
    is of that kind); the lowest in priority."""
    place = {n: i for i, n in enumerate(ranked)}
    count: dict[str, int] = {}
    for m in members:
        count[kinds.get(m, "")] = count.get(kinds.get(m, ""), 0) + 1
    spare = [
        m for m in members if m not in stragglers and (count[kinds.get(m, "")] > 1 or kinds.get(m, "") == newcomer)
    ]
    return max(spare, key=lambda m: place.get(m, 1 << 62)) if spare else None


def node_kind(resources: Mapping[str, object]) -> str:
    """A node's hardware shape from its Ray resources: GPUs, accelerator type, CPUs."""
    accel = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
    gpus, cpus = _number(resources.get("GPU")), _number(resources.get("CPU"))
    return f"gpu={gpus:g}{'/' + ','.join(accel) if accel else ''} cpu={cpus:g}"


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def cap_warning(run_id: str, members: int, observers: int, cap: int | None) -> str:
    return (
        f"the W&B run {run_id} uses {members + observers} nodes, more than max_node_writers={cap}: "
        f"{members} of them write to it (each kind of node, the lowest ranks and any straggler first); "
        f"the other {observers} are observed only, their latest samples in the run's nodes table every minute"
    )
