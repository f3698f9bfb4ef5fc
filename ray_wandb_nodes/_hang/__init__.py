"""Hangs: each rank's progress beacon, the evidence taken from a rank's process out of band, and
the verdict across ranks.

``beacon`` is the per-rank shared-memory slot (written on the hot path, read by the node's
logger); ``policy`` says when silence is a hang; ``evidence`` arms a rank (faulthandler on a
signal, the flight recorder, a dump thread) and takes its dumps; ``stacks`` and ``flight`` parse
what the dumps hold into typed values; ``verdict`` names who stopped and who waits. Nothing here
imports Ray or wandb: the node loggers, the health monitor and the callbacks drive it.
"""

from .beacon import Beacon, BeaconSlot, Phase, RankProgress, default_root, install_step_hook, progress_of, read_slots
from .evidence import RankEvidence, arm, disarm, evidence_from_dumps, request_dump, request_dumps
from .flight import Collective, FlightRecord, flight_recorder_env
from .policy import HangTimeout, hung_ranks, job_cadence_s, limit_s, parse_hang_timeout
from .stacks import Frame, ThreadStack, parse_faulthandler
from .verdict import HangRow, RankFacts, Verdict, format_stack_groups, judge, rank_ranges

__all__ = [
    "Beacon",
    "BeaconSlot",
    "Collective",
    "FlightRecord",
    "Frame",
    "HangRow",
    "HangTimeout",
    "Phase",
    "RankEvidence",
    "RankFacts",
    "RankProgress",
    "ThreadStack",
    "Verdict",
    "arm",
    "default_root",
    "disarm",
    "evidence_from_dumps",
    "flight_recorder_env",
    "format_stack_groups",
    "hung_ranks",
    "install_step_hook",
    "job_cadence_s",
    "judge",
    "limit_s",
    "parse_faulthandler",
    "parse_hang_timeout",
    "progress_of",
    "rank_ranges",
    "read_slots",
    "request_dump",
    "request_dumps",
]
