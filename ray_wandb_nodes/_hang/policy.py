"""When silence is a hang: the ``hang_timeout_s`` option and the limits it gives each rank.

``hang_timeout_s`` takes a number of seconds, ``"auto"`` (the default) or ``None`` (off). What a
setting gives, per rank and phase (all capped below the process-group timeout, see below):

==========================  ===============================  ================================
rank is                     ``"auto"``                       a number ``T``
==========================  ===============================  ================================
running, or in a report     max(120 s, 5 x the slowest       ``T``
                            interval of the last hour)
before its first progress   max(600 s, 3 x the running       3 x ``T``
(model load, compile)       limit)
checkpointing, evaluating,  max(600 s, 3 x the running       3 x ``T``
preparing                   limit)
==========================  ===============================  ================================

Why those: five times the slowest interval is the margin NVIDIA's resiliency extension uses for
its heartbeats, and two minutes keeps a job that steps every second from being judged on one
slow batch. Before the first step a rank loads the model, compiles it and warms its data, and a
checkpoint save, an evaluation pass or a preparation of the user's own (``long_phase``) runs no
optimizer step for many intervals: those get three times the running limit, and at least ten
minutes under ``"auto"``.

**What ``"auto"`` follows.** The cadence is the slowest interval between progress that any rank
showed in the last hour (each rank's beacon keeps the slowest interval of each ten-minute
bucket, six buckets, and its node reads the slowest still in the window), with two things left
out: long phases (they have their own limit), and any interval longer than the running limit in
force when it ended, which was a hang whether it was judged one or not. Why a windowed maximum:

- A job's slow intervals are rare by nature (a data refill every 100 steps, a shard download an
  epoch, a sync every N minutes): 1 % of intervals or fewer. A percentile high enough to keep
  them is the maximum of any window of fewer than a few thousand steps, and a percentile that
  leaves them out calls the job hung each time one comes. A maximum over time keeps a slow
  interval for as long as the window holds one of its occurrences, which is every occurrence
  of one that recurs within the hour, and needs 16 bytes a bucket in the slot.
- A one-off storage stall under the limit (a 90 s NFS hiccup raises the limit to 450 s) is
  forgotten an hour after it, not kept for the rest of the run; one over the limit (a
  5-minute stall against 2 minutes) was a hang and never raises the limit at all: a resolved
  hang is no evidence of the job's rhythm, and counting it would hide the next real hang for
  five times as long.
- An hour, because the slow events that make a job's rhythm recur within it in nearly every
  job (100 steps of up to half a minute, an epoch of a small data set); a rhythm slower than
  that is forgotten between two occurrences, and each occurrence is judged as the first one was,
  never worse. Buckets of ten minutes bound what the window costs and how coarsely it forgets.
- Each rank decides what was a hang with its own cadence, which in data-parallel training (the
  ranks step together) is the job's; the job's cadence is the slowest of its ranks'.

So under ``"auto"`` a pause longer than the running limit is named every time it comes, however
often it recurs (2 minutes for a job that steps in seconds): a preparation of the job's own that
long (a shard download each epoch) goes in ``long_phase("preparing")``, or set a number.

The cap: torch's process-group timeout (Ray's ``TorchConfig.timeout_s``, 1800 s by default) ends
the processes and the evidence with them, so every limit stays below it by a margin of
max(60 s, 10 %) (at most half the timeout): the evidence is taken while the processes live.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._config.values import AUTO, HangTimeout, parse_hang_timeout
from .slot import LONG_PHASES, Phase, RankProgress

__all__ = ["AUTO", "HangTimeout", "parse_hang_timeout"]  # the option's value, owned by the configuration
AUTO_FLOOR_S = 120.0
CADENCE_FACTOR = 5.0
LONG_FACTOR = 3.0
LONG_FLOOR_S = 600.0
MARGIN_FLOOR_S = 60.0
MARGIN_FRACTION = 0.1


def evidence_margin_s(pg_timeout_s: float) -> float:
    """How far below the process-group timeout every limit stays."""
    return min(max(MARGIN_FLOOR_S, MARGIN_FRACTION * pg_timeout_s), 0.5 * pg_timeout_s)


def job_cadence_s(ranks: Iterable[RankProgress]) -> float | None:
    """The slowest recent interval between progress any rank shows (each rank's is its beacon's
    window, long phases and resolved hangs left out); None where no rank has one."""
    seen = [r.slowest_interval_s for r in ranks if r.slowest_interval_s is not None]
    return max(seen) if seen else None


def auto_running_limit_s(cadence_s: float | None) -> float:
    """``"auto"``'s running limit for a cadence (before the process-group cap): also what a
    rank's beacon leaves out of its cadence as a hang (``Beacon(hang_limit_s=...)``)."""
    return max(AUTO_FLOOR_S, CADENCE_FACTOR * cadence_s) if cadence_s else AUTO_FLOOR_S


def limit_s(
    setting: HangTimeout,
    *,
    cadence_s: float | None,
    started: bool,
    phase: Phase,
    pg_timeout_s: float | None = None,
) -> float | None:
    """Seconds of silence after which a rank in ``phase`` is hung; None when the option is off.

    ``cadence_s`` is the job's slowest recent interval (:func:`job_cadence_s`), ``started``
    whether the rank made any progress yet, ``pg_timeout_s`` the process-group timeout (None
    where there is none, as in Ray's report barrier). A rank whose train function has not started
    (``Phase.STARTING``: Ray is setting up its worker group) is not judged."""
    if phase is Phase.STARTING:
        return None
    if setting.auto:
        running = auto_running_limit_s(cadence_s)
        long = max(LONG_FLOOR_S, LONG_FACTOR * running)
    elif setting.seconds is not None:
        running = setting.seconds
        long = LONG_FACTOR * running
    else:
        return None
    limit = long if (not started or phase in LONG_PHASES) else running
    if pg_timeout_s is not None and pg_timeout_s > 0:
        limit = min(limit, pg_timeout_s - evidence_margin_s(pg_timeout_s))
    return limit


def hung_ranks(
    setting: HangTimeout, ranks: Iterable[RankProgress], pg_timeout_s: float | None = None
) -> list[RankProgress]:
    """The ranks silent for longer than their limit, by rank (the job's cadence from all)."""
    ranks = list(ranks)
    cadence = job_cadence_s(ranks)
    out = []
    for rank in ranks:
        limit = limit_s(setting, cadence_s=cadence, started=rank.started, phase=rank.phase, pg_timeout_s=pg_timeout_s)
        if limit is not None and rank.age_s > limit:
            out.append(rank)
    return sorted(out, key=lambda r: r.rank)


def job_hung(
    setting: HangTimeout, ranks: Iterable[RankProgress], pg_timeout_s: float | None = None
) -> list[RankProgress]:
    """The job's hung ranks (:func:`hung_ranks`), or none while a rank in a long phase (a
    checkpoint's save or upload, an evaluation, a preparation) is still within its own limit:
    the others wait on it, in Ray's report barrier or the next collective, and their silence is
    not theirs."""
    ranks = list(ranks)
    hung = hung_ranks(setting, ranks, pg_timeout_s)
    held = {r.rank for r in hung}
    if any(r.phase in LONG_PHASES and r.rank not in held for r in ranks):
        return []
    return hung
