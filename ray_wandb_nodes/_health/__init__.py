"""Live node health: each node's latest samples, a node table, and straggler and node-lost alerts.

``summary`` turns a writer's recent samples (wandb keeps them per run) into a
:class:`NodeSummary` (``messages``); ``rule`` is the straggler rule, pure; ``node_judge`` and
``gpus`` judge nodes and GPUs (``gpu_node``: one node's GPUs as its summaries tell them);
``monitor`` holds one run's nodes and says, tick by tick, which alerts to raise (grouped by cause
and held against flapping by ``alert_groups``) and what the tables (``table``) hold; ``alerts``
and ``degradation`` write the words. The names below are what other packages use.
"""

from .alerts import ALERT_WAIT_S, Alert, gpu_finding, gpu_name
from .degradation import read_warning
from .gpu import GpuEvent
from .gpus import GpuHealth
from .kinds import Degradation, EventKind, GpuState, NodeEnd, NodeState
from .messages import GpuIntBatch, GpuInts, GpuInventory, GpuSummary, NodeSummary, ReadProblem
from .monitor import HealthMonitor, HealthOptions, NodeView, Notice, TickResult
from .reader import SummaryReader, aged
from .rule import StragglerRule
from .summary import gpu_ints, summarize
from .table import COLUMNS, GPU_COLUMNS

__all__ = [
    "ALERT_WAIT_S",
    "COLUMNS",
    "GPU_COLUMNS",
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
