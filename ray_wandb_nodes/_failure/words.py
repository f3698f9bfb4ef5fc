"""What a failed attempt puts into the run (pure): one ERROR alert that names the first death
(rank, node, GPU, cause: the exception with its innermost user frame, or the death with the
node's evidence) and calls what followed its consequence; the run summary's ``failure`` fields
(a runs table's column of why runs failed); the traceback and the account of every failing rank
as files of the run; and, with retries, an INFO alert when a later attempt recovers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._hang import rank_ranges
from .cgroup import GIB, gib
from .choose import Cause, Verdict
from .facts import Kind, OomEvidence, RankFailure, Shape
from .stuck import Waited
from .texts import first_line, short_message

TITLE_LIMIT = 120  # characters of an alert's title
LIST_LIMIT = 20  # causes, and groups of consequences, named in an alert; the rest counted (all are in the files)
RANK_FILES_LIMIT = 16  # causes with a file of their own (a cause of several ranks: one file)
CONSEQUENCE_TRACEBACKS = 8  # consequences whose tracebacks consequences.txt holds; the others in a line or two
# A node that left the cluster with its memory this full (%) at its last sample was likely killed
# whole for memory (a pod's cgroup at its limit: Kubernetes OOMKilled). Ray's memory monitor acts
# at 95% by default, and the last sample is one sampling interval old: a node growing into its
# limit passes 90% on its way there; a healthy node that sits above 90% is rare (the figure is
# used memory, without the page cache the kernel reclaims first).
POD_OOM_PERCENT = 90.0
GREW_BYTES = GIB // 8  # growth that names a rank (a rank's memory moves by tens of MB from step to step)
# Ray's account of its memory monitor's kill. 2.60: "N worker(s) were killed due to the node running
# low on memory. Memory on the node (IP: .., ID: ..) was 1.54GB used / 2.00GB limit (0.768471)\nOOM
# kill reason: Memory usage ..B exceeded threshold of ..B (75.0% of 2147483648B limit)\nSelected to
# kill: (Actor(..): ..., task name=RayTrainWorker.__init__, ..., pid=126, actual memory used=1.26GB,
# ...)" once for each worker it killed (the plugin's node logger among them, seen); before 2.56:
# "... was 3.60 / 3.75 GB (0.96), which exceeds the memory usage threshold of 0.95".
_RAY_NODE = re.compile(r"was ([\d.]+)\s*GB(?: used)? / ([\d.]+)\s*GB")
_RAY_THRESHOLD = re.compile(r"\(([\d.]+)% of \d+B limit\)|memory usage threshold of (\d[\d.]*\d|\d)")
_RAY_KILLED = re.compile(r"task name=([^,)]+)[^\n]*?, pid=(\d+), actual memory used=([\d.]+)GB")
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
    """The cause in a few words: ``ValueError: bad shard 17``, ``out of memory: killed by ...``."""
    if f.kind is Kind.RAISED:
        message = short_message(f.message)
        return f"{f.error_type}: {message}" if message else f.error_type
    if f.kind is Kind.OOM and f.error_type:  # the rank raised for memory: its DataLoader worker killed (table)
        return short_message(f.message)
    if f.kind is Kind.OOM:
        return memory_text(f)
    if f.kind is Kind.SIGNAL and f.signal:
        return f"died by {f.signal}" + (f" ({f.ended_by})" if f.ended_by else "")
    if f.kind is Kind.SIGNAL:
        return "died with no Python exception (a signal: SIGKILL, the kernel's OOM killer or a crash)"
    if f.kind is Kind.STUCK:
        return "stuck outside the collective the others waited in"
    if f.kind is Kind.LOST:
        memory = f.oom.memory_percent if f.oom is not None else None
        if memory is not None and memory >= POD_OOM_PERCENT:
            sample = f"{memory:.0f}% in use at its last sample"
            return f"its node left the cluster, likely out of memory ({sample}: a pod-level OOM kill)"
        return "its node left the cluster"
    return "stopped answering Ray's health check"


def memory_text(f: RankFailure) -> str:
    """``out of memory: killed by the kernel's OOM killer (its memory cgroup counted 1 OOM kill as
    it died; limit 3.0 GiB, peak 3.0 GiB; the rank used 2.7 GiB at its last sample)``, or by Ray's
    memory monitor (``node at 76% of 2.0 GB, threshold 75.0%; the rank used 1.26 GB``, the other
    workers it killed at once, and which rank grew)."""
    oom = f.oom or OomEvidence()
    parts: list[str] = []
    if oom.ray_monitor:
        by = "Ray's memory monitor"
        parts += _ray_figures(f.traceback, oom)
        parts += _grew(f.rank, oom)
    else:
        by = "the kernel's OOM killer"
        whose = "its memory cgroup" if oom.own_cgroup else "the node's memory cgroup"
        if oom.at_death:
            parts.append(f"{whose} counted {_kills(oom.at_death)} as it died")
        elif oom.cgroup_oom_kills:
            parts.append(f"{whose} counted {_kills(oom.cgroup_oom_kills)} during the run")
        figures = [f"{name} {gib(value)}" for name, value in (("limit", oom.limit), ("peak", oom.peak)) if value]
        if figures:
            parts.append(", ".join(figures))
        if oom.rss is not None:
            parts.append(f"the rank used {gib(oom.rss)} at its last sample")
    return f"out of memory: killed by {by}" + (f" ({'; '.join(parts)})" if parts else "")


def _ray_figures(text: str, oom: OomEvidence) -> list[str]:
    """The node's use and threshold, the rank's size, and the other workers Ray killed with it."""
    parts = []
    node = _RAY_NODE.search(f"{oom.ray_monitor} {text}")
    if node:
        used, total = float(node.group(1)), float(node.group(2))
        threshold = _RAY_THRESHOLD.search(text)
        limit = f", threshold {threshold.group(1)}%" if threshold and threshold.group(1) else (
            f", threshold {threshold.group(2)}" if threshold else "")  # fmt: skip
        parts.append(f"node at {100 * used / total:.0f}% of {total:.1f} GB{limit}")
    killed = list(dict.fromkeys(_RAY_KILLED.findall(text)))
    ranks = [k for k in killed if "TrainWorker" in k[0]]
    gb = float(ranks[0][2]) if len(ranks) == 1 else oom.process_gb
    if gb is not None:
        parts.append(f"the rank used {gb:.2f} GB")
    others = [
        f"{name.split('.')[0]} ({float(used):.2f} GB)" for name, _, used in killed if (name, _, used) not in ranks
    ]
    if len(killed) > 1:
        parts.append(f"Ray killed {len(killed)} workers at once, with it: {', '.join(others) or 'other ranks'}")
    return parts


def _kills(n: int) -> str:
    return f"{n} OOM kill{'s' if n != 1 else ''}"


def _grew(killed: int, oom: OomEvidence) -> list[str]:
    """Which rank of the node grew: Ray's memory monitor kills the newest worker, which need not be it."""
    if oom.grew is None:
        return []
    rank, first, peak = oom.grew
    if peak - first < GREW_BYTES:
        return []
    if rank == killed:
        return [f"it grew from {gib(first)} to {gib(peak)}"]
    return [f"rank {rank} grew from {gib(first)} to {gib(peak)}; Ray killed rank {killed}, the newest worker"]


def evidence_lines(f: RankFailure) -> list[str]:
    """What says so: the frame of a raise; Ray's account and the node's memory for a death (the
    figures of an OOM kill are in its cause)."""
    lines = []
    if f.error_type:  # a raise (its kind OOM where a DataLoader worker was killed): where it was raised
        if f.frame is not None:
            lines.append(f"at {f.frame.text}")
        return lines
    if f.kind is Kind.STUCK:
        if f.frame is not None:
            lines.append(f"where it stood as Ray stopped it: {f.frame.text}")
        return lines + ([first_line(f.message)] if f.message else [])
    if f.message:
        lines.append(f"Ray: {first_line(f.message)}" if f.by_ray else first_line(f.message))
    oom = f.oom
    if f.kind is Kind.LOST and cause_text(f) != "its node left the cluster":
        lines.append("a node this full that leaves was likely killed whole for memory (on Kubernetes its pod's "
                     "status reads OOMKilled; see the nodes alert)")  # fmt: skip
    if oom is not None and f.kind is not Kind.LOST:
        if f.kind is not Kind.OOM:
            lines += _cgroup_lines(oom)
        # Where the cause has its cgroup's or Ray's figures, the node's own sample (of the machine's
        # memory, where wandb reads /proc/meminfo in a container) would only contradict them.
        figures = f.kind is Kind.OOM and (oom.own_cgroup or bool(oom.ray_monitor))
        if oom.memory_percent is not None and not figures:
            lines.append(f"the node's memory was {oom.memory_percent:.0f}% in use at its last sample")
    return lines


def _cgroup_lines(oom: OomEvidence) -> list[str]:
    """A death the memory cgroup does not call an OOM kill: what it counted, as said."""
    whose = "its memory cgroup" if oom.own_cgroup else "the node's memory cgroup"
    total = oom.cgroup_oom_kills
    if oom.at_death is not None:
        during = f" ({total} during the run)" if total else ""
        return [f"{whose} counted no OOM kill as the process died{during}"]
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
    if f.kind in (Kind.LOST, Kind.OOM) or f.error_type:
        return f"{who} {where}: {cause_text(f)}"
    if f.kind is Kind.STUCK:
        them = "the rank the others waited for" if len(cause.ranks) == 1 else "the ranks the others waited for"
        return f"{who} {where}: {them}, stopped outside the collective they timed out in"
    return f"{who} {where} {cause_text(f)}"


def _follows_lines(consequences: Sequence[RankFailure], waited: Waited | None = None) -> list[str]:
    """One line per way of following (a peer lost, a peer waited out, the barrier, later), with
    its lowest rank's words: the ranks' messages differ only in ports and directions. ``waited``:
    the collective the waiters of a stuck rank timed out in."""
    groups: dict[str, list[RankFailure]] = {}
    waiting = frozenset(waited.waiters) if waited is not None else frozenset()
    for f in consequences:
        if waited is not None and f.shape is Shape.PEER_TIMEOUT and f.rank in waiting:
            what = waited.sentence()
        else:
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


def _title(verdict: Verdict, attempt: int, numbered: bool, waited: Waited | None = None) -> str:
    first = verdict.first
    if first is not None and first.failure.kind is Kind.STUCK and waited is not None:
        who = ranks_text(first.ranks)
        waiters = ranks_text(waited.waiters)
        title = f"{who[0].upper()}{who[1:]} stuck: {waiters} timed out waiting in {waited.collective()}"
    elif first is None and not verdict.consequences:
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


def failure_notice(
    verdict: Verdict, attempt: int = 1, max_failures: int = 0, retrying: bool = False, waited: Waited | None = None
) -> FailureNotice:
    """The ERROR alert, summary fields and files of a failed attempt (``attempt`` 1 for the first;
    ``retrying``: Ray's failure policy decided to retry; ``waited``: the collective the ranks
    behind a stuck rank timed out in, ``stuck.waited_for``)."""
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
        lines += _follows_lines(verdict.consequences, waited)
    lines.append(retry_line(attempt, max_failures, retrying))
    files = _files(verdict)
    if files:
        lines.append(f"Tracebacks and accounts: failures/attempt-{attempt}/")
    text = "\n".join(lines)
    return FailureNotice(attempt, _title(verdict, attempt, numbered, waited), text, "ERROR",
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
