"""The node fleet: a writer on every node a W&B run uses, one ``NodeLogger`` actor per node.

``fleet`` (the command queue, its one thread; ``worker``: the order of each turn and of a run's end)
carries out what ``plan`` (a pure function) decides, through the ``pool`` (logger actors, placement
groups, joins, health: each logger's ``handle``, its ``joins``, ``pings`` in turn and statuses taken
in, ``intake``) and the offline ``collect``-ion; ``targets`` are the runs' wishes
(``target_commands``: what each command changes in them); ``node_logger`` is the actor itself
(``hosted``: its record of each writer; ``node_samples``: their summaries read; ``node_offline``:
its offline-run calls), ``egress`` the run's relay and the nodes without a route to W&B, ``watches``
says which ranks' folders each one watches, ``hangs`` and ``failures`` name a run's hangs and failed
attempts (a hang's readings in ``hang_reads``, its nodes asked in ``hang_nodes``, its evidence round
in ``hang_round``, its ranks ended in ``hang_ends``, its view for the failure rule in
``hang_views``), ``janitor`` removes placement groups a dead controller left, ``nodes`` reads Ray's
node list and ``listing`` keeps the fleet's view of it (the alive nodes, re-read once a poll).
"""

from .failures import FailureWatch
from .fleet import POLL_S, NodeFleet, RelayPlan
from .hangs import HangSetting, HangWatch, poll_s
from .nodes import NodeInfo
from .run_writer import RunWriter
from .targets import Relayed, RunProcess, RunTarget, SharedTarget, StandaloneTarget

__all__ = [
    "POLL_S",
    "FailureWatch",
    "HangSetting",
    "HangWatch",
    "NodeFleet",
    "NodeInfo",
    "RelayPlan",
    "Relayed",
    "RunProcess",
    "RunTarget",
    "RunWriter",
    "SharedTarget",
    "StandaloneTarget",
    "poll_s",
]
