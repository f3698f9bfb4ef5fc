"""Patching a module of another package on a train worker, whether it is imported before the
plugin's set-up there or after: now if it is imported, else right after its import runs.

A finder at the front of ``sys.meta_path`` answers for the awaited module names only: it looks the
module up with the other finders (stepping aside for that lookup) and wraps the loader it finds,
so that the patches run once the module's code has run. A lookup is not an import
(transformers asks ``importlib.util.find_spec("wandb")`` before it imports it): the wrapped
loader only patches a module it executes. Once no name is awaited the finder leaves
``sys.meta_path``; while one is, it costs every other import of the process one dict lookup.

A patch is applied once: to the module imported already, or right after the first import of it
that runs. One that raises is said once in the log and leaves the module as it is: the import
that ran it goes on (a user's ``import transformers`` never fails for the plugin).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._warn import describe, logger

Patch = Callable[[ModuleType], None]

_awaited: dict[str, list[Patch]] = {}  # module name -> patches not yet applied
_lock = threading.Lock()
_looking = threading.local()  # the names this thread's finder is looking up (it steps aside for them)


def when_imported(name: str, patch: Patch) -> None:
    """``patch(module)`` once module ``name`` is imported: now if it is, else right after its import
    runs (once: the same ``patch``, by equality, is awaited once a name)."""
    with _lock:
        waiting = _awaited.setdefault(name, [])
        if patch not in waiting:
            waiting.append(patch)
        if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport())
    module = sys.modules.get(name)
    if module is not None:
        _apply(name, module)


def awaited() -> list[str]:
    """The module names with patches still to apply (tests, diagnostics)."""
    with _lock:
        return sorted(_awaited)


def _apply(name: str, module: ModuleType) -> None:
    with _lock:
        patches = _awaited.pop(name, [])
        if not _awaited:
            for finder in [f for f in sys.meta_path if isinstance(f, _PatchOnImport)]:
                sys.meta_path.remove(finder)  # nothing awaited: no finder in every import's way
    for patch in patches:
        try:
            patch(module)
        except Exception as e:  # noqa: BLE001 - the import goes on, the module as it is
            logger.warning("ray_wandb_nodes: %s was not patched and is left as it is (%s)", name, describe(e))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of an awaited module so that its patches run right after its code."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        looking: set[str] = getattr(_looking, "names", set())
        if name not in _awaited or name in looking:
            return None
        _looking.names = looking | {name}
        try:
            spec = importlib.util.find_spec(name)  # the real finders (this one steps aside, above)
        finally:
            _looking.names = looking
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
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
        _apply(module.__name__, module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)
