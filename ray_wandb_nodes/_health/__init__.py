"""Live node health: each node's latest samples, a node table, and straggler and node-lost alerts.

``summary`` turns a writer's recent samples (wandb keeps them per run) into a few numbers;
``rule`` is the straggler rule, pure; ``monitor`` holds one run's nodes and says, tick by tick,
which alerts to raise and what the node table holds.
"""

from .monitor import Alert, HealthMonitor, HealthOptions, TickResult
from .rule import StragglerRule
from .summary import summarize

__all__ = ["Alert", "HealthMonitor", "HealthOptions", "StragglerRule", "TickResult", "summarize"]
