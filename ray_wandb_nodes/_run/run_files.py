"""Texts kept as files of a run: written under a folder of the run's directory and saved into the
run now (a failed attempt's tracebacks and accounts, a hang's stacks); offline, wandb's folder
keeps them and ``sync`` brings them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def save_run_files(run: Any, folder: str, files: Iterable[tuple[str, str]], offline: bool) -> None:
    """Each (name, text) of ``files`` as ``folder/name`` in ``run``'s directory (a name may hold a
    folder of its own), saved into the run unless ``offline``. Raises what writing or wandb raises:
    each caller says in one warning what was not saved."""
    for name, text in files:
        path = os.path.join(run.dir, folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if not offline:
            run.save(path, base_path=run.dir, policy="now")
