"""Failures: why a job failed, named in its run.

``record`` is a rank's own record of how it ended (written where its Python can still act,
beside its hang beacon); ``node`` is what the node's logger tells of its ranks from outside
(records, processes gone, the cgroup's OOM kills); ``table`` joins those with what Ray's
controller saw into one row a failing rank; ``choose`` names the first death the cause and
the rest its consequence; ``words`` writes the alert, the summary fields and the files.
``attempt`` is a failed attempt as the driver side saw it (what crosses to the fleet thread).
``deaths`` is a watcher's look at its ranks' ends, attempt by attempt (a node logger's, or
the fleet's for the controller's own node). ``texts`` reads the libraries' words (gloo, NCCL,
Ray). Nothing here imports Ray or wandb: ``_ray.failures`` reads Ray's objects into these values.
"""

from .attempt import FailedAttempt, FailureEvent
from .choose import Cause, Verdict, choose
from .deaths import SETTLE_S, NodeDeaths
from .facts import CollectiveAt, Kind, OomEvidence, RankFailure, RayPoll, RayRankError, Shape, UserFrame, Window
from .last_words import MARKERS as LAST_WORDS_MARKERS
from .last_words import LastWords, read_last_words
from .node import DeathWatch, Gone, NodeFacts, OomCounter, RankMemory, node_facts, oom_kills, process_gone
from .record import RankRecord, RankRecorder, RecordKind, read_records, remember_positions
from .stuck import HangView, Waited, waited_for
from .table import RankPlace, rank_failures
from .texts import innermost_user_frame, ray_death, shape_of
from .words import FailureNotice, FailureSummary, failure_notice, recovered_notice

__all__ = [
    "LAST_WORDS_MARKERS",
    "SETTLE_S",
    "Cause",
    "CollectiveAt",
    "DeathWatch",
    "FailedAttempt",
    "FailureEvent",
    "FailureNotice",
    "FailureSummary",
    "Gone",
    "HangView",
    "Kind",
    "LastWords",
    "NodeDeaths",
    "NodeFacts",
    "OomCounter",
    "OomEvidence",
    "RankFailure",
    "RankMemory",
    "RankPlace",
    "RankRecord",
    "RankRecorder",
    "RayPoll",
    "RayRankError",
    "RecordKind",
    "Shape",
    "UserFrame",
    "Verdict",
    "Waited",
    "Window",
    "choose",
    "failure_notice",
    "innermost_user_frame",
    "node_facts",
    "oom_kills",
    "process_gone",
    "rank_failures",
    "ray_death",
    "read_last_words",
    "read_records",
    "recovered_notice",
    "remember_positions",
    "shape_of",
    "waited_for",
]
