"""Hangs: each rank's progress beacon, the evidence taken from a rank's process out of band, and
the verdict across ranks.

``beacon`` writes the per-rank shared-memory slot (on the hot path) and ``slot`` reads it (the
node's logger); ``folders`` names an attempt's folder of slots and dumps and keeps it no longer
than its processes; ``policy`` says when silence is a hang and ``confirm`` when a suspicion is
one; ``evidence`` arms a rank (faulthandler on a signal, the flight recorder, a dump thread) and
``dumps`` takes its dumps (``proc`` reads what ``/proc`` says of its process); ``node`` is what a
node's logger runs (the folders it watches, every rank's evidence, an end); ``stacks`` and
``flight`` parse what the dumps hold into typed values; ``position`` says where one rank is and
``verdict`` who stopped and who waits. Nothing here imports Ray or wandb: the node loggers, the
health monitor and the callbacks drive it.
"""

from .beacon import (
    LONG_PHASES,
    Beacon,
    BeaconSlot,
    Phase,
    RankProgress,
    default_root,
    install_step_hook,
    progress_of,
    read_slots,
)
from .confirm import Counts, Place, Rounds, counts_of, describe_place, place_of, still_hung, suspicion_key
from .dumps import evidence_from_dumps, request_dump, request_dumps, request_end
from .ending import EndAnswer, HangError, RankProcess
from .evidence import RankEvidence, arm, disarm
from .flight import Collective, FlightRecord, flight_recorder_env
from .folders import attempt_key, new_token, rank_processes, remove_dead, remove_if_dead, run_dir, touch
from .native import PYSPY_TIMEOUT_S, native_dumps
from .node import DUMPS_TIMEOUT_S, NodeWatch, RankAnswers, end_ranks, rank_evidence
from .policy import (
    HangTimeout,
    auto_running_limit_s,
    hung_ranks,
    job_cadence_s,
    job_hung,
    limit_s,
    parse_hang_timeout,
)
from .position import RankFacts
from .rank import (
    ArmedRank,
    arm_rank,
    armed_rank,
    disarm_rank,
    enter_phase,
    hook_steps,
    in_phase,
    in_report,
    leave_phase,
    train_starts,
)
from .report import HANG_COLUMNS, HangNotice, ended_notice, evidence_text, hang_notice, resumed_notice
from .stacks import Frame, ThreadStack, parse_faulthandler
from .verdict import HangRow, Verdict, format_stack_groups, judge, rank_ranges

__all__ = [
    "DUMPS_TIMEOUT_S",
    "HANG_COLUMNS",
    "LONG_PHASES",
    "PYSPY_TIMEOUT_S",
    "ArmedRank",
    "Beacon",
    "BeaconSlot",
    "Collective",
    "Counts",
    "EndAnswer",
    "FlightRecord",
    "Frame",
    "HangError",
    "HangNotice",
    "HangRow",
    "HangTimeout",
    "NodeWatch",
    "Phase",
    "Place",
    "RankAnswers",
    "RankEvidence",
    "RankFacts",
    "RankProcess",
    "RankProgress",
    "Rounds",
    "ThreadStack",
    "Verdict",
    "arm",
    "arm_rank",
    "armed_rank",
    "attempt_key",
    "auto_running_limit_s",
    "counts_of",
    "default_root",
    "describe_place",
    "disarm",
    "disarm_rank",
    "end_ranks",
    "ended_notice",
    "enter_phase",
    "evidence_from_dumps",
    "evidence_text",
    "flight_recorder_env",
    "format_stack_groups",
    "hang_notice",
    "hook_steps",
    "hung_ranks",
    "in_phase",
    "in_report",
    "install_step_hook",
    "job_cadence_s",
    "job_hung",
    "judge",
    "leave_phase",
    "limit_s",
    "native_dumps",
    "new_token",
    "parse_faulthandler",
    "parse_hang_timeout",
    "place_of",
    "progress_of",
    "rank_evidence",
    "rank_processes",
    "rank_ranges",
    "read_slots",
    "remove_dead",
    "remove_if_dead",
    "request_dump",
    "request_dumps",
    "request_end",
    "resumed_notice",
    "run_dir",
    "still_hung",
    "suspicion_key",
    "touch",
    "train_starts",
]
