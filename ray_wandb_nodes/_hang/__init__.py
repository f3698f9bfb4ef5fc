"""Hangs: each rank's progress beacon, the evidence taken from a rank's process out of band, and
the verdict across ranks.

``beacon`` writes the per-rank shared-memory slot (on the hot path) and ``slot`` reads it (the
node's logger); ``policy`` says when silence is a hang; ``evidence`` arms a rank (faulthandler on a
signal, the flight recorder, a dump thread) and takes its dumps; ``stacks`` and ``flight`` parse
what the dumps hold into typed values; ``verdict`` names who stopped and who waits. Nothing here
imports Ray or wandb: the node loggers, the health monitor and the callbacks drive it.
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
from .ending import HangError
from .evidence import RankEvidence, arm, disarm
from .flight import Collective, FlightRecord, flight_recorder_env
from .native import PYSPY_TIMEOUT_S, native_dumps
from .policy import (
    HangTimeout,
    auto_running_limit_s,
    hung_ranks,
    job_cadence_s,
    job_hung,
    limit_s,
    parse_hang_timeout,
)
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
    run_dir,
    train_starts,
)
from .report import HANG_COLUMNS, HangNotice, ended_notice, evidence_text, hang_notice, resumed_notice
from .stacks import Frame, ThreadStack, parse_faulthandler
from .verdict import HangRow, RankFacts, Verdict, format_stack_groups, judge, rank_ranges

__all__ = [
    "HANG_COLUMNS",
    "LONG_PHASES",
    "PYSPY_TIMEOUT_S",
    "ArmedRank",
    "Beacon",
    "BeaconSlot",
    "Collective",
    "Counts",
    "FlightRecord",
    "Frame",
    "HangError",
    "HangNotice",
    "HangRow",
    "HangTimeout",
    "Phase",
    "Place",
    "RankEvidence",
    "RankFacts",
    "RankProgress",
    "Rounds",
    "ThreadStack",
    "Verdict",
    "arm",
    "arm_rank",
    "armed_rank",
    "auto_running_limit_s",
    "counts_of",
    "default_root",
    "describe_place",
    "disarm",
    "disarm_rank",
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
    "parse_faulthandler",
    "parse_hang_timeout",
    "place_of",
    "progress_of",
    "rank_ranges",
    "read_slots",
    "request_dump",
    "request_dumps",
    "request_end",
    "resumed_notice",
    "run_dir",
    "still_hung",
    "suspicion_key",
    "train_starts",
]
