"""What both callbacks do when they are built: validate options, capture the W&B environment."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

from .options import Options, build_options, options_of
from .secrets import CapturedEnv, capture_env


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
