"""Frameworks' own W&B logging on the train workers: one history writer per run.

Hugging Face's ``Trainer`` (``report_to="wandb"``), Lightning's ``WandbLogger`` and Accelerate's
W&B tracker call ``wandb.init`` from global rank 0 inside the train function. Beside the plugin's
run that makes a second W&B run per job, holding rank 0's node only. Joining it to the plugin's
shared run instead would give that run two history writers (the primary logs the reports, the
node tables and the straggler count), which W&B does not support in shared mode: the server
overwrote the primary's first rows once a second writer logged history (wandb/wandb#12269,
closed as unsupported); shared mode also drops ``log(step=...)`` and the framework's
``define_metric("*", step_metric=...)`` would re-axis the primary's charts.

So on every train worker, before the train function starts, the plugin makes a framework's
``wandb.init`` return a disabled run (the framework's calls on it do nothing) and says so once per
process, naming the setting that turns the framework's logging off. A ``wandb.init`` that the
train function calls itself is left alone. The framework's values still reach the run through
Ray's report callbacks (``RayTrainReportCallback``), which is where the plugin reads them.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._warn import logger

MARK = "_ray_wandb_nodes_quiet"
# (module prefix of the caller of wandb.init, what it is, the setting that turns it off)
_LIGHTNING = ("Lightning's WandbLogger", "leave WandbLogger out of Trainer(logger=...)")
FRAMEWORKS: tuple[tuple[str, str, str], ...] = (
    ("transformers.", 'the Hugging Face Trainer\'s W&B logging (report_to="wandb")', 'report_to="none"'),
    ("accelerate.", 'Accelerate\'s W&B tracker (log_with="wandb")', 'leave "wandb" out of Accelerator(log_with=...)'),
    ("lightning.", *_LIGHTNING),
    ("pytorch_lightning.", *_LIGHTNING),
    ("lightning_fabric.", *_LIGHTNING),
)
_state: dict[str, Any] = {"warned": False, "rank": None, "run_id": None}


def framework_of(module: str | None) -> tuple[str, str] | None:
    """(what it is, the setting that turns it off) for a calling module, or None (not a framework)."""
    for prefix, what, setting in FRAMEWORKS:
        if module and (module.startswith(prefix) or module == prefix[:-1]):
            return what, setting
    return None


def message(what: str, setting: str, rank: int | None, run_id: str | None) -> str:
    where = f" on rank {rank}" if rank is not None else ""
    run = f"this job's run {run_id}" if run_id else "this job's run"
    return (
        f"{what}{where} was turned off: it would write a second W&B run beside {run}, which "
        f"holds the values Ray's report callback reports and every node's system metrics (one history "
        f"writer per run: W&B does not support two in shared mode). Set {setting} to silence this."
    )


def quiet_frameworks(rank: int | None = None, run_id: str | None = None) -> None:
    """In a train worker: frameworks' ``wandb.init`` return a disabled run from now on (wandb
    patched now if imported, else as it is imported). Idempotent."""
    _state.update(rank=rank, run_id=run_id)
    module = sys.modules.get("wandb")
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(module: ModuleType) -> None:
    init = getattr(module, "init", None)
    if init is None or getattr(init, MARK, False):
        return
    module.init = _quiet(init)  # type: ignore[attr-defined]


def _quiet(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def quiet_init(*args: Any, **kwargs: Any) -> Any:
        found = framework_of(sys._getframe(1).f_globals.get("__name__"))
        if found is None:
            return init(*args, **kwargs)
        if not _state["warned"]:
            _state["warned"] = True
            logger.warning("ray_wandb_nodes: %s", message(*found, _state["rank"], _state["run_id"]))
        kwargs["mode"] = "disabled"
        return init(*args, **kwargs)

    setattr(quiet_init, MARK, True)
    return quiet_init


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``wandb.init`` right after ``import wandb`` runs ``wandb/__init__.py``."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "wandb":
            return None
        # Out of the way while the real finders look wandb up, then back: a lookup is not an
        # import (transformers asks ``importlib.util.find_spec("wandb")`` before it imports it).
        # The loader takes the hook out for good once it has patched the imported module.
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if "wandb" not in sys.modules:
                sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self._loader.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)
        for finder in [f for f in sys.meta_path if isinstance(f, _PatchOnImport)]:
            sys.meta_path.remove(finder)  # wandb is imported and patched: no hook needed

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)
