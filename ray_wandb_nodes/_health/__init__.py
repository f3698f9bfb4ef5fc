"""Live health: the nodes, GPUs and ranks of a run judged, their tables and their alerts.

``summary`` turns a writer's recent samples (wandb keeps them per run) into a
:class:`NodeSummary` (``messages``); ``rule`` is the straggler rule, pure; ``node_judge`` and
``gpus`` judge nodes and GPUs (``gpu_node``: one node's GPUs as its summaries tell them),
``ranks`` (with ``rank_rule`` and ``rank_table``) the ranks' steps; ``monitor`` holds one run's
nodes and ranks and says, tick by tick, which alerts to raise (grouped by cause and held against
flapping by ``alert_groups``, the node and GPU alerts a slow rank explains held back by
``claims``) and what the tables (``table``, paced by ``node_tables``) hold; ``alerts`` and
``degradation`` write the words.
The names below are what other packages use.
"""

from .alerts import ALERT_WAIT_S, Alert, gpu_finding, gpu_name
from .degradation import read_warning
from .gpu import GpuEvent
from .gpus import GpuHealth
from .kinds import Degradation, EventKind, GpuState, NodeEnd, NodeState
from .messages import GpuIntBatch, GpuInts, GpuInventory, GpuSummary, NodeSummary, ReadProblem
from .monitor import HealthMonitor, HealthOptions, NodeView, Notice, TickResult
from .rank_table import RANK_COLUMNS
from .ranks import RankAt
from .reader import SummaryReader, aged
from .rule import StragglerRule
from .summary import gpu_ints, summarize
from .table import COLUMNS, GPU_COLUMNS

__all__ = [
    "ALERT_WAIT_S",
    "COLUMNS",
    "GPU_COLUMNS",
    "RANK_COLUMNS",
    "Alert",
    "Degradation",
    "EventKind",
    "GpuEvent",
    "GpuHealth",
    "GpuIntBatch",
    "GpuInts",
    "GpuInventory",
    "GpuState",
    "GpuSummary",
    "HealthMonitor",
    "HealthOptions",
    "NodeEnd",
    "NodeState",
    "NodeSummary",
    "NodeView",
    "Notice",
    "RankAt",
    "ReadProblem",
    "StragglerRule",
    "SummaryReader",
    "TickResult",
    "aged",
    "gpu_finding",
    "gpu_ints",
    "gpu_name",
    "read_warning",
    "summarize",
]
