"""The words node health speaks in, each defined once: a node's state, a GPU's state and the kind
of an event (each a ``str`` enum, so a table cell, a warning key and the offline index carry the
plain word)."""

from __future__ import annotations

from enum import Enum


class NodeState(str, Enum):
    """A node's state in the ``nodes`` table."""

    OK = "ok"
    STRAGGLER = "straggler"  # worse than the other nodes for the window
    LOST = "lost"  # left the cluster while the run used it
    LEFT = "left"  # the run no longer uses it

    def __str__(self) -> str:
        return self.value


class GpuState(str, Enum):
    """A GPU's state in the ``gpus`` table (the worst that holds, in this order)."""

    OK = "ok"
    LOST = "lost"  # stopped reporting while its node samples on
    MEMORY_ERRORS = "memory errors"  # its uncorrectable ECC count rose during the run
    SLOW = "slow"  # busy at a clock far below its peers'
    IDLE = "idle"  # its rank's GPU at zero while the others work

    def __str__(self) -> str:
        return self.value


class EventKind(str, Enum):
    """What an alert (or a recovery from it, ``Alert.recovered``) is about."""

    STRAGGLER = "straggler"
    RECOVERED = "recovered"  # a straggler no longer is one
    NODE_LOST = "lost"
    SLOW_GPU = "slow-gpu"
    IDLE_GPU = "idle-gpu"
    GPU_MEMORY_ERRORS = "gpu-memory-errors"
    GPU_LOST = "gpu-lost"
    HANG = "hang"  # a rank stopped while the others wait (``_hang``); recovered: progress again
    SLOW_RANK = "slow-rank"  # the rank the others wait for in their collectives (``rank_rule``)
    SLOW_COMMUNICATION = "slow-communication"  # every rank waits in its collectives, none is late
    RANK_FAILED = "rank-failed"  # an attempt failed: its first death and why (``_failure``); recovered: trains again

    def __str__(self) -> str:
        return self.value


class NodeEnd(str, Enum):
    """How Ray says a node ended (its ``DeathReason`` in the node listing)."""

    UNKNOWN = "unknown"  # Ray said nothing (not listed dead, or a listing without the reason)
    TERMINATED = "terminated"  # ended on purpose: SIGTERM (a pod deleted), ``ray stop``
    CRASHED = "crashed"  # its health checks failed: known dead only after they did
    PREEMPTED = "preempted"  # the autoscaler drained it for a preemption
    IDLE = "idle"  # the autoscaler drained it as idle

    def __str__(self) -> str:
        return self.value


class Degradation(str, Enum):
    """Why node health sees less of a node than it should: one warning each, per node."""

    LOG_UNREADABLE = "txlog"  # wandb's transaction log cannot be read: no SM clock, no ECC counts
    SAMPLES_UNREADABLE = "samples"  # wandb's kept samples cannot be read: no summary at all
    NO_GPU = "no-gpu"  # a node whose ranks Ray gave GPUs reports none

    def __str__(self) -> str:
        return self.value
