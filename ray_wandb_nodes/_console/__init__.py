"""The ranks' console in the run: what each rank prints, labelled by rank, in the run's Logs tab.

Read on each node by its logger, from the files Ray already writes for every worker process
(``follow``), never by redirecting a rank's file descriptors: nothing runs in the rank. ``lines``
splits bytes into lines and collapses progress bars; ``budget`` keeps a run under W&B's 100,000
lines (whose lines, how many, the last lines of a failed attempt's dead ranks first); ``mask``
masks the secrets in every line before it leaves the node (``masked_sink``: the one way out);
``rank`` is one rank's pipeline; ``tailer`` is the logger's thread, sent ``commands``, following
the node's ranks (``node_ranks``, each rank's process and files in ``watched``); ``sender`` writes
the lines into the run. Nothing here imports
Ray; ``sender`` alone uses wandb, and only the run it is given.
"""

from .budget import PLUGIN_LINES, RUN_LINES, ConsolePlan, RankBudget, dead_allowance, plan_console
from .commands import EndAttempt, Finish, RankProcess, Watch
from .follow import FileFollower, log_tail, worker_files
from .lines import MAX_LINE_BYTES, PROGRESS_EVERY_S, ConsoleLine, Kind, LineSplitter, Stream
from .rank import EchoFilter, RankConsole
from .sender import RunConsole, format_line
from .tailer import ConsoleTailer

__all__ = [
    "MAX_LINE_BYTES",
    "PLUGIN_LINES",
    "PROGRESS_EVERY_S",
    "RUN_LINES",
    "ConsoleLine",
    "ConsolePlan",
    "ConsoleTailer",
    "EchoFilter",
    "EndAttempt",
    "FileFollower",
    "Finish",
    "Kind",
    "LineSplitter",
    "RankBudget",
    "RankConsole",
    "RankProcess",
    "RunConsole",
    "Stream",
    "Watch",
    "dead_allowance",
    "format_line",
    "log_tail",
    "plan_console",
    "worker_files",
]
