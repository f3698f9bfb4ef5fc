"""What both callbacks do with their options: validate them into ``Options`` when they are built,
capture the W&B environment, and capture the key again where a pickled callback is restored."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .options import TUNE, Options, build_options, invalid, options_of
from .secrets import CapturedEnv, capture_env

# wandb.init arguments the Tune callback sets itself, and why.
TUNE_OWNED = {"id": "each trial's run id is its trial id", "name": "each run is named for its trial"}


def wandb_init_params() -> list[str] | None:
    """The parameter names of ``wandb.init``, or None when wandb is not installed."""
    try:
        import wandb
    except ImportError:
        return None
    return list(inspect.signature(wandb.init).parameters)


def default_base_url() -> str | None:
    try:
        from wandb.sdk.lib.urls import DEFAULT_BASE_URL
    except ImportError:
        return None
    return str(DEFAULT_BASE_URL)


def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def configure(callback: str, given: Mapping[str, Any]) -> tuple[Options, CapturedEnv]:
    """Validated options of ``callback`` ("train" or "tune") from its ``__init__``'s arguments
    (``given``: its ``locals()``; the table's names are picked, the rest ignored), and the driver's
    captured W&B environment. ``ValueError`` naming option, value and what is allowed;
    ``ImportError`` when logging would need a missing wandb."""
    values = {o.name: given[o.name] for o in options_of(callback)}
    if callback == TUNE:
        for owned, why in TUNE_OWNED.items():
            if owned in values["wandb_init_kwargs"]:
                raise invalid(owned, values["wandb_init_kwargs"][owned], f"not accepted by the Tune callback: {why}")
    params = wandb_init_params()
    built = build_options(
        env_mode=os.environ.get("WANDB_MODE") or ("disabled" if env_true("WANDB_DISABLED") else None),
        init_params=params,
        callback=callback,
        **values,
    )
    if built.mode.logs and params is None:
        raise ImportError("ray_wandb_nodes needs wandb to log (pip install 'wandb>=0.28'), or pass mode='disabled'")
    api_key, api_key_file = values["api_key"], values["api_key_file"]
    env = capture_env(os.environ, api_key=api_key, api_key_file=api_key_file, default_base_url=default_base_url())
    return built, env


def without_key(env: CapturedEnv) -> CapturedEnv:
    """``env`` as a pickle may hold it: the API key left out (captured again on restore)."""
    return replace(env, api_key=None)


def key_recaptured(env: CapturedEnv, api_key_file: str | None) -> CapturedEnv:
    """``env`` with the API key captured again from this process's environment (or ``api_key_file``),
    where a restored callback lost it; ``ValueError`` saying why when none is found."""
    found = capture_env(os.environ, api_key_file=api_key_file, default_base_url=default_base_url())
    return replace(env, api_key=found.api_key, api_key_source=found.api_key_source)
