"""Frameworks' own W&B logging on the train workers: one history writer per run.

Hugging Face's ``Trainer`` (``report_to="wandb"``), Lightning's ``WandbLogger`` and Accelerate's
W&B tracker call ``wandb.init`` from global rank 0 inside the train function. Beside the plugin's
run that makes a second W&B run per job, holding rank 0's node only. Joining it to the plugin's
shared run instead would give that run two history writers (the primary logs the reports, the
node tables and the straggler count), which W&B does not support in shared mode: the server
overwrote the primary's first rows once a second writer logged history (wandb/wandb#12269,
closed as unsupported); shared mode also drops ``log(step=...)`` and the framework's
``define_metric("*", step_metric=...)`` would re-axis the primary's charts.

So on every train worker, before the train function starts (every worker group's start, and from
Ray 2.56 every replaced replica group's), the plugin makes a framework's ``wandb.init`` return a
disabled run (the framework's calls on it do nothing) and says so once per process, naming the
setting that turns the framework's logging off. A ``wandb.init`` that the train function calls
itself is left alone. The framework's values still reach the run through Ray's report callbacks
(``RayTrainReportCallback``), which is where the plugin reads them.

The disabled run is then the process's ``wandb.run`` (and ``wandb.log`` its ``log``): user code
that logs to it logs nothing. The first such call in a process says so once, naming
``ray.train.report`` as the way to the job's run. (A ``wandb.init`` of the user's own after it
makes a run of its own: wandb 0.28 to 0.31 never hand the disabled run back.)
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._warn import logger
from .on_import import when_imported

MARK = "_ray_wandb_nodes_quiet"
# (module prefix of the caller of wandb.init, what it is, what turns it off: a phrase that starts with a verb)
_LIGHTNING = ("Lightning's WandbLogger", "leave WandbLogger out of Trainer(logger=...)")
FRAMEWORKS: tuple[tuple[str, str, str], ...] = (
    ("transformers.", 'the Hugging Face Trainer\'s W&B logging (report_to="wandb")', 'set report_to="none"'),
    ("accelerate.", 'Accelerate\'s W&B tracker (log_with="wandb")', 'leave "wandb" out of Accelerator(log_with=...)'),
    ("lightning.", *_LIGHTNING),
    ("pytorch_lightning.", *_LIGHTNING),
    ("lightning_fabric.", *_LIGHTNING),
)
_state: dict[str, Any] = {"warned": False, "rank": None, "run_id": None, "framework": None, "swallowed": False}


def framework_of(module: str | None) -> tuple[str, str] | None:
    """(what it is, the setting that turns it off) for a calling module, or None (not a framework)."""
    for prefix, what, setting in FRAMEWORKS:
        if module and (module.startswith(prefix) or module == prefix[:-1]):
            return what, setting
    return None


def _where(rank: int | None) -> str:
    return f" on rank {rank}" if rank is not None else ""


def _run(run_id: str | None) -> str:
    return f"this job's run {run_id}" if run_id else "this job's run"


def message(what: str, setting: str, rank: int | None, run_id: str | None) -> str:
    return (
        f"{what}{_where(rank)} was turned off: it would write a second W&B run beside {_run(run_id)}, which "
        f"holds the values Ray's report callback reports and every node's system metrics (one history "
        f"writer per run: W&B does not support two in shared mode). {setting[:1].upper()}{setting[1:]} to silence this."
    )


def swallowed_message(call: str, what: str | None, rank: int | None, run_id: str | None) -> str:
    """What a user's call that landed on a framework's disabled run is told (once a process)."""
    whose = f"that {what} got" if what else "that a framework got"
    return (
        f"{call}{_where(rank)} logged nothing: wandb.run in this train worker is the disabled run {whose} "
        f"(one history writer per run). To log to {_run(run_id)}, report the values with "
        f'ray.train.report(metrics): rank 0\'s reports are logged, every rank\'s with rank_metrics="reduce" or "all".'
    )


def quiet_frameworks(rank: int | None = None, run_id: str | None = None) -> None:
    """In a train worker: frameworks' ``wandb.init`` return a disabled run from now on (wandb
    patched now if imported, else as it is imported). Idempotent."""
    _state.update(rank=rank, run_id=run_id)
    when_imported("wandb", _patch)


def _patch(module: ModuleType) -> None:
    init = getattr(module, "init", None)
    if init is None or getattr(init, MARK, False):
        return
    module.init = _quiet(module, init)  # type: ignore[attr-defined]


def _quiet(module: ModuleType, init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def quiet_init(*args: Any, **kwargs: Any) -> Any:
        found = framework_of(_caller())
        if found is None:  # the user's own: left alone (wandb 0.28 to 0.31 make it a run of its own,
            return init(*args, **kwargs)  # the disabled run never handed back)
        if not _state["warned"]:
            _state["warned"] = True
            logger.warning("ray_wandb_nodes: %s", message(*found, _state["rank"], _state["run_id"]))
        kwargs["mode"] = "disabled"
        _state["framework"] = found[0]
        run = init(*args, **kwargs)
        _watch(module, run)
        return run

    setattr(quiet_init, MARK, True)
    return quiet_init


def _caller() -> str | None:
    """The module of the code that called the function that calls this."""
    name = sys._getframe(2).f_globals.get("__name__")
    return name if isinstance(name, str) else None


def _watch(module: ModuleType, run: Any) -> None:
    """The disabled run's ``log`` (also ``wandb.log`` while it is ``wandb.run``) says once when code
    other than a framework's calls it: the user's values would be lost without a word."""
    log = getattr(run, "log", None)
    if log is None or _is_watched(run):
        return

    @functools.wraps(log)
    def watched_log(*args: Any, **kwargs: Any) -> Any:
        if framework_of(_caller()) is None:
            _say_swallowed("wandb.log()")
        return log(*args, **kwargs)

    setattr(watched_log, MARK, True)
    try:
        run.log = watched_log
    except Exception:  # noqa: BLE001 - a run type that takes no attributes: left as it is
        return
    if getattr(module, "run", None) is run:
        module.log = watched_log  # type: ignore[attr-defined]


def _is_watched(run: Any) -> bool:
    """Whether ``run`` is a disabled run that a framework got here (its ``log`` is watched)."""
    return bool(getattr(getattr(run, "log", None), MARK, False))


def _say_swallowed(call: str) -> None:
    if not _state["swallowed"]:
        _state["swallowed"] = True
        text = swallowed_message(call, _state["framework"], _state["rank"], _state["run_id"])
        logger.warning("ray_wandb_nodes: %s", text)
