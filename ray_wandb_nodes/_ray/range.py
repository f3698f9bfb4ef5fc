"""The Ray releases the plugin serves, and why another cannot (a version string and flags in, the
words out, the Train V2 switch read from the environment; ``_ray.check_ray`` asks the installed
Ray and raises with them)."""

from __future__ import annotations

import os

RAY_RANGE = ((2, 50), (2, 60))  # the oldest and newest Ray minor releases supported
SUPPORTED_RAY = ">=2.50,<2.61"
V2_ENV = "RAY_TRAIN_V2_ENABLED"


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``2.55.1`` or ``3.0.0rc1``; None if unreadable."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def unsupported_ray(version: str | None, *, train: bool, v2_enabled: bool | None = None) -> str | None:
    """Why this Ray cannot serve the plugin (None when it can): not installed, outside the range,
    or (for Train) with Train V2 turned off. The text names the version, the range and what to do."""
    where = f"ray_wandb_nodes supports Ray 2.50 to 2.60 (pip install 'ray[train,tune]{SUPPORTED_RAY}')"
    if version is None:
        return f"Ray is not installed; {where}"
    got = minor(version)
    if got is None or not RAY_RANGE[0] <= got <= RAY_RANGE[1]:
        return f"ray {version} is installed; {where}"
    if train and v2_enabled is False:
        env = os.environ.get(V2_ENV)
        setting = f"{V2_ENV}={env!r}" if env is not None else f"{V2_ENV} unset"
        if got < (2, 51):
            how = f"set {V2_ENV}=1 before ray.train is imported (Train V2 is opt-in on Ray {got[0]}.{got[1]})"
        else:
            how = f"unset {V2_ENV} (Train V2 is the default from Ray 2.51)"
        return f"WandbNodesCallback needs Ray Train V2, which is off (ray {version}, {setting}): {how}"
    return None


def train_v2_enabled() -> bool:
    from ray.train.v2._internal.constants import is_v2_enabled

    return bool(is_v2_enabled())


def ray_version() -> str | None:
    """The installed Ray's version, None without Ray."""
    try:
        import ray
    except ImportError:
        return None
    return str(ray.__version__)
