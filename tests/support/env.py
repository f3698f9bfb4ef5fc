"""The W&B environment the tests give the plugin: the dummy key, fast writer settings, and an
offline ``WANDB_DIR`` with a backend of its own that must stay unused."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tests.support.wandb_backend import WandbTestBackend

if TYPE_CHECKING:  # not at run time: Ray's train workers import tests.support.training, so this
    import pytest

DUMMY_KEY = "k" * 40
# Settings every test writer gets: samples and uploads often enough for short runs.
FAST = {"x_file_stream_transmit_interval": 1}


@contextmanager
def offline_backend(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, WandbTestBackend]]:
    """``WANDB_DIR`` in a folder of its own, and a backend of its own that must stay unused."""
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    with WandbTestBackend() as own_backend:
        monkeypatch.setenv("WANDB_BASE_URL", own_backend.base_url)
        yield wandb_dir, own_backend


def _at_least(package: str, major: int, minor: int) -> bool:
    # The installed distribution's version, not ``import wandb``: Ray's train workers import the
    # test modules that hold their train loops, and so this one. Importing wandb there took about
    # 0.25 CPU-s a worker, and it hid what a user's worker sees: no wandb until a framework imports it.
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


# wandb 0.31 samples as a writer joins (0.28 and 0.29 first after one sampling interval), and its
# tables are read back by the tests (0.28/0.29 log a table again under its key as a reference to the
# previous table's artifact, which RunRecord.tables does not follow).
WANDB_SAMPLES_AT_JOIN = _at_least("wandb", 0, 31)
WANDB_TABLES = _at_least("wandb", 0, 31)


def worker_env(backend: WandbTestBackend, project: str, tmp_path: Any) -> dict[str, str]:
    """What a user's workers have when W&B is set up on the cluster: a framework's own run (or
    any ``wandb.init`` there without a project) goes to ``project`` on the test backend."""
    return {
        "WANDB_BASE_URL": backend.base_url,
        "WANDB_API_KEY": DUMMY_KEY,
        "WANDB_PROJECT": project,
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
    }
