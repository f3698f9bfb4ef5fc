"""What a failed attempt puts into the run (pure): one ERROR alert that names the first death
(rank, node, GPU, cause: the exception with its innermost user frame, or the death with the
node's evidence) and calls what followed its consequence; the run summary's ``failure`` fields
(a runs table's column of why runs failed); the traceback and the account of every failing rank
as files of the run; and, with retries, an INFO alert when a later attempt recovers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._hang import rank_ranges
from .choose import Cause, Verdict
from .facts import Kind, OomEvidence, RankFailure, Shape
from .texts import first_line, short_message

TITLE_LIMIT = 120  # characters of an alert's title
LIST_LIMIT = 20  # causes, and groups of consequences, named in an alert; the rest counted (all are in the files)
RANK_FILES_LIMIT = 16  # causes with a file of their own (a cause of several ranks: one file)
CONSEQUENCE_TRACEBACKS = 8  # consequences whose tracebacks consequences.txt holds; the others in a line or two
_FOLLOWS = {
    Shape.PEER_CLOSED: "a collective lost its peer",
    Shape.PEER_TIMEOUT: "a collective timed out waiting for its peers",
    Shape.BARRIER: "Ray Train's report barrier was abandoned",
}


@dataclass(frozen=True)
class FailureSummary:
    """The run summary's ``failure`` fields (one column each in a runs table)."""

    attempt: int  # the attempt that failed (1: the first)
    kind: str  # raised, signal, oom, lost, unresponsive; "unknown" where no cause was seen
    cause: str  # "ValueError: bad shard 17", "killed for memory (Ray's memory monitor)"
    rank: int | None = None  # the first death's rank
    node: str = ""
    gpu: str = ""
    where: str = ""  # the innermost user frame: "train.py:59 in load_shard"
    ranks: str = ""  # every rank of the first cause: "1", "2-3"
    recovered: bool = False  # a later attempt recovered

    def as_summary(self) -> dict[str, Any]:
        """``{"failure": {...}}`` for ``run.summary.update``: W&B shows ``failure.cause`` etc."""
        fields = {"attempt": self.attempt, "kind": self.kind, "cause": self.cause, "rank": self.rank,
                  "node": self.node, "gpu": self.gpu, "where": self.where, "ranks": self.ranks,
                  "recovered": self.recovered}  # fmt: skip
        return {"failure": {k: v for k, v in fields.items() if v is not None and v != ""}}


@dataclass(frozen=True)
class FailureNotice:
    """One failed attempt (or a recovery) as the run receives it: from the driver side's
    decision to the primary writer."""

    attempt: int
    title: str
    text: str
    level: str  # "ERROR" for a failure, "INFO" for a recovery
    summary: FailureSummary
    files: tuple[tuple[str, str], ...] = ()  # (file name, text) under :attr:`folder`

    @property
    def folder(self) -> str:
        return f"failures/attempt-{self.attempt}"


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3`` / ``ranks 0,2,5-7``."""
    return f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {rank_ranges(ranks)}"


def cause_text(f: RankFailure) -> str:
    """The cause in a few words: ``ValueError: bad shard 17``, ``killed for memory (...)``."""
    if f.kind is Kind.RAISED:
        message = short_message(f.message)
        return f"{f.error_type}: {message}" if message else f.error_type
    if f.kind is Kind.OOM:
        by = "Ray's memory monitor" if f.oom and f.oom.ray_monitor else "the kernel's OOM killer"
        return f"killed for memory ({by})"
    if f.kind is Kind.SIGNAL:
        return "died with no Python exception (a signal: SIGKILL, the kernel's OOM killer or a crash)"
    if f.kind is Kind.LOST:
        return "its node left the cluster"
    return "stopped answering Ray's health check"


def evidence_lines(f: RankFailure) -> list[str]:
    """What says so: the frame of a raise; Ray's account and the node's memory for a death."""
    lines = []
    if f.kind is Kind.RAISED:
        if f.frame is not None:
            lines.append(f"at {f.frame.text}")
        return lines
    if f.message:
        lines.append(f"Ray: {first_line(f.message)}" if f.by_ray else first_line(f.message))
    oom = f.oom
    if oom is not None:
        if oom.process_gb is not None:
            lines.append(f"the process used {oom.process_gb:.2f} GB when Ray's memory monitor killed it")
        lines += _cgroup_lines(oom)
        if oom.memory_percent is not None:
            lines.append(f"the node's memory was {oom.memory_percent:.0f}% in use at its last sample")
    return lines


def _cgroup_lines(oom: OomEvidence) -> list[str]:
    total = oom.cgroup_oom_kills
    if oom.at_death is not None:
        during = f" ({total} during the run)" if total else ""
        if oom.at_death > 0:
            return [f"the node's memory cgroup counted {oom.at_death} OOM kill(s) as the process died{during}"]
        return [f"the node's memory cgroup counted no OOM kill as the process died{during}"]
    if total is None:
        return [] if oom.ray_monitor else ["the node's memory cgroup could not be read"]
    return [f"the node's memory cgroup counted {total or 'no'} OOM kill{'s' if total != 1 else ''} during the run"]


def _where(f: RankFailure) -> str:
    gpus = f" (GPU {','.join(f.gpus)})" if f.gpus else ""
    return f"on {f.node}{gpus}"


def cause_sentence(cause: Cause) -> str:
    """``Rank 1 on node-a (GPU 1) raised ValueError: bad shard 17``."""
    f = cause.failure
    who = ranks_text(cause.ranks)
    who = who[0].upper() + who[1:]
    where = _where(f) if len(cause.nodes) == 1 else f"on {', '.join(cause.nodes)}"
    if f.kind is Kind.RAISED:
        return f"{who} {where} raised {cause_text(f)}"
    if f.kind is Kind.LOST:
        return f"{who} {where}: {cause_text(f)}"
    return f"{who} {where} {cause_text(f)}"


def _follows_lines(consequences: Sequence[RankFailure]) -> list[str]:
    """One line per way of following (a peer lost, a peer waited out, the barrier, later), with
    its lowest rank's words: the ranks' messages differ only in ports and directions."""
    groups: dict[str, list[RankFailure]] = {}
    for f in consequences:
        what = _FOLLOWS.get(f.shape) or ("failed after the job was already failing" if f.alive_after else
                                          "failed after an earlier death on its node")  # fmt: skip
        groups.setdefault(what, []).append(f)
    lines = []
    for what, fs in groups.items():
        first = fs[0]
        detail = short_message(first.message, 120) if first.kind is Kind.RAISED else cause_text(first)
        example = f" (rank {first.rank}: {detail})" if len(fs) > 1 else f": {detail}"
        lines.append(f"  {ranks_text([f.rank for f in fs])}: {what}{example if detail else ''}")
    return lines[:LIST_LIMIT] + ([f"  ... and {len(lines) - LIST_LIMIT} more"] if len(lines) > LIST_LIMIT else [])


def retry_line(attempt: int, max_failures: int, retrying: bool) -> str:
    """What Ray does next, as ``FailureConfig(max_failures=...)`` decides (-1: without limit)."""
    if retrying:
        limit = "" if max_failures < 0 else f" of at most {max_failures + 1}"
        return f"Ray restarts the job: attempt {attempt + 1}{limit} (FailureConfig max_failures={max_failures})."
    if attempt > 1 or max_failures > 0:
        return f"No retries left (FailureConfig max_failures={max_failures}): the run failed."
    return "The run failed (FailureConfig max_failures=0: no retries)."


def _title(verdict: Verdict, attempt: int, numbered: bool) -> str:
    first = verdict.first
    if first is None and not verdict.consequences:
        title = "Training failed: no rank's failure was seen"
    elif first is None:
        who = ranks_text([f.rank for f in verdict.consequences])
        title = f"Training failed: {who} failed after a peer; no rank's own failure was seen"
    else:
        f = first.failure
        who = ranks_text(first.ranks)
        who = who[0].upper() + who[1:]
        title = f"{who} failed: {cause_text(f)}" if f.kind is Kind.RAISED else f"{who}: {cause_text(f)}"
        if len(verdict.causes) > 1:
            title += f" (+{len(verdict.causes) - 1} other cause{'s' if len(verdict.causes) > 2 else ''})"
    if numbered:
        title = f"Attempt {attempt}: {title}"
    return title if len(title) <= TITLE_LIMIT else title[: TITLE_LIMIT - 1] + "…"


def failure_notice(verdict: Verdict, attempt: int = 1, max_failures: int = 0, retrying: bool = False) -> FailureNotice:
    """The ERROR alert, summary fields and files of a failed attempt (``attempt`` 1 for the first;
    ``retrying``: Ray's failure policy decided to retry)."""
    numbered = attempt > 1 or max_failures != 0
    lines = []
    for i, cause in enumerate(verdict.causes[:LIST_LIMIT]):
        if i == 1:
            lines.append("Also failed at once, on their own:")
        lines.append(cause_sentence(cause) if i == 0 else f"  {cause_sentence(cause)}")
        lines += [f"  {line}" if i == 0 else f"    {line}" for line in evidence_lines(cause.failure)]
    if len(verdict.causes) > LIST_LIMIT:
        lines.append(f"  ... and {len(verdict.causes) - LIST_LIMIT} more causes (failures/attempt-{attempt}/)")
    if verdict.first is None:
        lines.append("Every failing rank failed after a peer (below); the rank that failed first left no trace "
                     "the plugin could read (see the nodes and hangs alerts, and the ranks' logs).")  # fmt: skip
    if verdict.consequences:
        lines.append("What followed (consequences, not causes):" if verdict.first else "Failures:")
        lines += _follows_lines(verdict.consequences)
    lines.append(retry_line(attempt, max_failures, retrying))
    files = _files(verdict)
    if files:
        lines.append(f"Tracebacks and accounts: failures/attempt-{attempt}/")
    text = "\n".join(lines)
    return FailureNotice(attempt, _title(verdict, attempt, numbered), text, "ERROR",
                         failure_summary(verdict, attempt), (("verdict.txt", text + "\n"), *files))  # fmt: skip


def failure_summary(verdict: Verdict, attempt: int) -> FailureSummary:
    first = verdict.first
    if first is None:
        return FailureSummary(attempt, "unknown", "no rank's own failure was seen", ranks="")
    f = first.failure
    where = f"{f.frame.place} in {f.frame.function}" if f.frame else ""
    return FailureSummary(attempt, f.kind.value, cause_text(f)[:300], f.rank, f.node, ",".join(f.gpus),
                          where, rank_ranges(first.ranks))  # fmt: skip


def recovered_notice(attempt: int, failed: FailureSummary) -> FailureNotice:
    """The INFO alert when ``attempt`` trains again after ``failed`` (an earlier attempt's failure)."""
    who = f"rank {failed.rank}: " if failed.rank is not None else ""
    text = f"Training runs again after attempt {failed.attempt} failed ({who}{failed.cause})."
    summary = FailureSummary(failed.attempt, failed.kind, failed.cause, failed.rank, failed.node, failed.gpu,
                             failed.where, failed.ranks, recovered=True)  # fmt: skip
    return FailureNotice(attempt, f"Attempt {attempt} recovered", text, "INFO", summary)


def _account(f: RankFailure, traceback: bool = True) -> str:
    head = [f"{ranks_text([f.rank])} {_where(f)}: {f.kind.value}", f"cause: {cause_text(f)}", *evidence_lines(f)]
    body = f.traceback.strip() if traceback else ""
    return "\n".join(head) + ("\n\n" + body if body else "") + "\n"


def _files(verdict: Verdict) -> list[tuple[str, str]]:
    files = []
    for cause in verdict.causes[:RANK_FILES_LIMIT]:  # a cause of several ranks: its lowest rank's account
        f = cause.failure
        also = f"\nThe same on {ranks_text(cause.ranks)}.\n" if len(cause.ranks) > 1 else ""
        files.append((f"rank-{f.rank}.txt", _account(f) + also))
    if verdict.consequences:  # the first few with their tracebacks: they are alike, and there may be thousands
        accounts = (_account(f, i < CONSEQUENCE_TRACEBACKS) for i, f in enumerate(verdict.consequences))
        files.append(("consequences.txt", "\n".join(accounts)))
    return files
