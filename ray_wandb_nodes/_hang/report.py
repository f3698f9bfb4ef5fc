"""What a hang puts into the run (pure): the alert's words, the ``hangs`` table's rows and every
rank's evidence as a text file, one :class:`HangNotice` a hang and one when progress resumes."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from .._config.values import OnHang
from .position import RankFacts
from .stacks import format_stack
from .verdict import HangRow, Verdict, format_stack_groups, rank_ranges

# Stopped ranks the alert names one a line; past it, counted (every rank of 8,000 stuck in one
# place made an alert of 0.6 MB). The hangs table and verdict.txt have them all.
LIST_LIMIT = 40
# Past this many ranks, only the stopped ranks get a file of their own, and every rank's evidence
# is in one file, ``all-ranks.txt``: one a rank made 8,001 files a hang at 1,000 nodes.
RANK_FILES_LIMIT = 64
HANG_COLUMNS = (
    "rank", "node", "gpus", "last_step", "reports", "seconds_since_progress", "state", "where", "collective", "seq",
    "group",
)  # fmt: skip


@dataclass(frozen=True)
class HangNotice:
    """One hang (or its end) as the run receives it: from the fleet thread to the primary."""

    episode: int  # 1 for the run's first hang
    title: str
    text: str
    level: str  # "ERROR" for a hang, "INFO" when progress resumed
    rows: tuple[HangRow, ...] = ()  # the ``hangs`` table (none when resumed)
    files: tuple[tuple[str, str], ...] = ()  # (file name, text): every rank's evidence, the stacks
    stopped: tuple[int, ...] = ()  # the ranks that stopped (the others wait on them)
    name: str = ""  # the folder's name under ``hangs/`` ("": ``hang-<episode>``)

    @property
    def folder(self) -> str:
        """Where this hang's files go inside the run's files (a file's name may hold a subfolder)."""
        return f"hangs/{self.name or f'hang-{self.episode}'}"

    def table(self) -> list[list[object]]:
        return [
            [r.rank, r.node, r.gpus, r.last_step, r.reports, round(r.seconds_since_progress, 1), r.state, r.where,
             r.collective, r.seq if r.seq is not None else -1, r.group]
            for r in self.rows
        ]  # fmt: skip


def _since(age_s: float, now: datetime.datetime) -> str:
    return (now - datetime.timedelta(seconds=age_s)).strftime("%H:%M:%S UTC")


def hang_notice(
    verdict: Verdict,
    facts: Sequence[RankFacts],
    episode: int,
    on_hang: OnHang = OnHang.ALERT,
    now: datetime.datetime | None = None,
    taken: str = "",
    repeat: str = "",
) -> HangNotice:
    """The alert, table and files of ``verdict`` over ``facts`` (every rank of the run);
    ``taken`` says how the evidence was taken (its time, the nodes that gave none), in verdict.txt;
    ``repeat``: why this hang of ``on_hang="restart"`` does not end its attempt (the same place as
    the hang that ended the attempt before), which the alert says in place of the restart."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    by_rank = {f.progress.rank: f for f in facts}
    stopped = verdict.stopped or tuple(sorted(by_rank))
    where = []
    for rank in stopped:
        f = by_rank.get(rank)
        if f is not None:
            gpus = f" GPU {','.join(f.gpus)}" if f.gpus else ""
            where.append(
                f"rank {rank} on {f.node or '?'}{gpus}: last progress at step {f.progress.steps}, report "
                f"{f.progress.reports}, since {_since(f.progress.age_s, now)}"
            )
    files_at = f"Every rank's stacks are in the run's files under hangs/hang-{episode}/."
    if repeat:
        action = f"{repeat}\n{files_at}"
    elif on_hang.ends_attempt:
        action = "The attempt is ended so that Ray Train restarts it (on_hang='restart')."
    else:
        action = files_at
    named = where[:LIST_LIMIT]
    if len(where) > LIST_LIMIT:
        named.append(f"and {len(where) - LIST_LIMIT} more ranks (every rank is in the hangs table and verdict.txt)")
    text = f"{verdict.sentence}.\n" + "\n".join(named) + f"\n{action}"
    whole = f"{verdict.sentence}.\n" + "\n".join(where) + f"\n{action}"
    files = [("verdict.txt", whole + (f"\n{taken}" if taken else "") + "\n\n" + format_stack_groups(verdict))]
    ordered = sorted(facts, key=lambda f: f.progress.rank)
    if len(ordered) <= RANK_FILES_LIMIT:
        files += [(f"rank-{f.progress.rank}.txt", evidence_text(f)) for f in ordered]
    else:
        files += [(f"rank-{f.progress.rank}.txt", evidence_text(f)) for f in ordered if f.progress.rank in stopped]
        files.append(("all-ranks.txt", "\n".join(evidence_text(f) for f in ordered)))
    ranks = rank_ranges(stopped)
    title = f"Hang: rank{'s' if len(stopped) > 1 else ''} {ranks} stopped"
    return HangNotice(episode, title, text, "ERROR", verdict.rows, tuple(files), tuple(stopped))


def resumed_notice(episode: int, ranks: Sequence[int], after_s: float, finished: Sequence[int] = ()) -> HangNotice:
    """Progress again after hang ``episode`` (``ranks`` moved, ``finished`` returned from their
    train function, which is progress too): an INFO alert, no table, no files."""
    every = sorted({*ranks, *finished})
    text = f"Progress resumed {after_s:.0f} s after hang {episode} was raised"
    moved = f" (ranks {rank_ranges(ranks)})" if ranks else ""
    done = f"ranks {rank_ranges(finished)} finished training" if finished else ""
    text += f"{moved}; {done}." if ranks and done else f"{moved}." if ranks else f": {done}."
    return HangNotice(
        episode, f"Hang over: rank{'s' if len(every) > 1 else ''} {rank_ranges(every)} progress again", text, "INFO"
    )


def ended_notice(episode: int, ranks: Sequence[int], after_s: float) -> HangNotice:
    """The run ended with hang ``episode`` still open (``ranks`` stopped, no progress since): its
    closing INFO alert, so that every hang alerted is closed in the run."""
    return HangNotice(
        episode,
        "Hang over: the run ended",
        f"The run ended {after_s:.0f} s after hang {episode} was raised, with no progress of "
        f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} since.",
        "INFO",
    )


def evidence_text(facts: RankFacts) -> str:
    """One rank's file: its progress, every thread's stack (the training thread first), what
    could not be taken, and the collectives its flight recorder has in flight."""
    p = facts.progress
    lines = [
        f"rank {p.rank} (pid {p.pid}) on {facts.node or '?'}" + (f", GPU {','.join(facts.gpus)}" if facts.gpus else ""),
        f"steps {p.steps}, reports {p.reports}, phase {p.phase.name.lower()}, no progress for {p.age_s:.1f} s",
    ]
    evidence = facts.evidence
    if evidence is None:
        return "\n".join([*lines, "no evidence came back from this rank's node"]) + "\n"
    for note in evidence.notes:
        lines.append(f"note: {note}")
    source = "named Python stacks" if evidence.python else "faulthandler (C-level, without the GIL)"
    lines.append(f"\nthreads ({source}), the training thread first:")
    lines += [format_stack(stack) for stack in evidence.threads()]
    if evidence.native_frames:
        lines.append("\nnative frames (py-spy dump --native):")
        lines.append(evidence.native_frames.rstrip())
    if evidence.flight is not None:
        lines.append("\nflight recorder, collectives in flight:")
        lines += [f"  {c.op} #{c.seq} ({c.pg}) {c.state}" for c in evidence.flight.in_flight()] or ["  none"]
    return "\n".join(lines) + "\n"
