"""The node fleet: a writer on every node a W&B run uses, one ``NodeLogger`` actor per node.

``fleet`` (the command queue, its one thread, retiring runs) carries out what ``plan`` (a pure
function) decides, through the ``pool`` (logger actors, placement groups, joins, health) and the
offline ``collect``-ion; ``targets`` are the runs' wishes; ``node_logger`` is the actor itself
(``hosted``: its record of each writer; ``node_samples``: their summaries read; ``node_offline``:
its offline-run calls), ``egress`` the run's relay and the nodes without a route to W&B,
``watches`` says which ranks' folders each one watches, ``hangs`` and ``failures`` name a run's
hangs and failed attempts, ``janitor`` removes placement groups a dead controller left, ``nodes``
reads Ray's node list.
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
