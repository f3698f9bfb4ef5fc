"""The callback's options: one frozen dataclass, validated before any resource is taken."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MODES = ("online", "offline", "disabled")
STRATEGIES = ("shared", "main", "node", "all")
RANK_METRICS = ("rank0", "reduce", "all")
# wandb's own spellings that mean one of ours.
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}
NODE_SELECTIONS = ("workers", "cluster")
OFFLINE_TRANSFERS = ("auto", "ray", "storage")
STRAGGLER_MODES = ("max", "min")

# wandb.init parameters the plugin sets itself; the user sets them through the named options.
_OWNED_INIT_KWARGS = {
    "mode": "mode",
    "project": "project",
    "entity": "entity",
    "group": "group",
    "name": "name",
    "tags": "tags",
    "notes": "notes",
    "config": "config",
    "reinit": None,
}
# Settings fields that decide each writer's role; the plugin owns them.
OWNED_SETTINGS = ("mode", "x_primary", "x_label", "x_update_finish_state", "api_key")
# W&B rejects project names with these characters.
_BAD_PROJECT_CHARS = re.compile(r"[/\\#?%:]")


@dataclass(frozen=True)
class Options:
    """Validated options of :class:`~ray_wandb_nodes.WandbNodesCallback`."""

    project: str | None = None
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()
    notes: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    log_config: bool = True
    excludes: tuple[str, ...] = ()
    mode: str | None = None  # None: from WANDB_MODE at construction, else online
    nodes: str = "workers"
    sampling_interval_s: float = 15.0
    gpu_device_ids: tuple[int, ...] | None = None
    init_timeout_s: float = 90.0
    finish_timeout_s: float = 60.0
    offline_transfer: str = "auto"
    strategy: str = "shared"
    rank_metrics: str = "rank0"
    upload_checkpoints: bool = False
    upload_timeout_s: float = 1800.0
    wandb_init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    # live node health (see _health/)
    straggler_metric: str | None = None
    straggler_mode: str = "max"
    straggler_threshold: float = 0.7
    straggler_window_s: float = 120.0
    alerts: bool = True
    max_node_writers: int = 256  # node writers of one shared run (see _fleet/cap.py)


def invalid(option: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"ray_wandb_nodes: invalid {option}={value!r}; {allowed}")


def resolve_mode(mode: str | None, env_mode: str | None) -> str:
    """The effective mode: the option, else ``WANDB_MODE``, else online."""
    if mode is not None:
        source, value = "mode", mode
    elif env_mode:
        source, value = "WANDB_MODE", env_mode
    else:
        return "online"
    if not isinstance(value, str):
        raise invalid(source, value, f"expected one of {', '.join(MODES)}")
    value = _MODE_ALIASES.get(value.strip().lower(), value.strip().lower())
    if value not in MODES:
        extra = " (shared mode is what the plugin uses underneath online runs)" if value == "shared" else ""
        raise invalid(source, value if source == "mode" else env_mode, f"expected one of {', '.join(MODES)}{extra}")
    return value


def _positive_seconds(option: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise invalid(option, value, "expected a finite number of seconds greater than 0")
    if value < minimum:
        raise invalid(option, value, f"expected a finite number of seconds, at least {minimum}")
    return float(value)


def _str_or_none(option: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise invalid(option, value, "expected a non-empty string or None")
    return value


def _str_tuple(option: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise invalid(option, value, "expected a list of strings")
    items = tuple(value)
    if not all(isinstance(v, str) and v for v in items):
        raise invalid(option, value, "expected a list of non-empty strings")
    return items


def _settings_dict(value: Any) -> dict[str, Any]:
    """A user's ``settings=`` (dict or wandb.Settings) as the dict of fields they set."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        out = dict(value)
    elif hasattr(value, "model_fields_set") and hasattr(value, "model_dump"):
        dumped = value.model_dump()
        out = {k: dumped[k] for k in value.model_fields_set if k in dumped}
    else:
        raise invalid("settings", value, "expected a dict or a wandb.Settings")
    owned = sorted(k for k in out if k in OWNED_SETTINGS)
    if owned:
        raise invalid(
            "settings",
            {k: ("***" if k == "api_key" else out[k]) for k in owned},
            f"the plugin sets {', '.join(owned)} itself for each writer; use the callback's mode/api_key options",
        )
    return out


def build_options(
    *,
    project: Any = None,
    entity: Any = None,
    group: Any = None,
    name: Any = None,
    tags: Any = None,
    notes: Any = None,
    config: Any = None,
    log_config: Any = True,
    excludes: Any = None,
    mode: Any = None,
    env_mode: str | None = None,
    nodes: Any = "workers",
    sampling_interval_s: Any = 15.0,
    gpu_device_ids: Any = None,
    init_timeout_s: Any = 90.0,
    finish_timeout_s: Any = 60.0,
    offline_transfer: Any = "auto",
    api_key: Any = None,
    api_key_file: Any = None,
    strategy: Any = "shared",
    rank_metrics: Any = "rank0",
    upload_checkpoints: Any = False,
    upload_timeout: Any = 1800.0,
    wandb_init_kwargs: Mapping[str, Any] | None = None,
    init_params: Sequence[str] | None = None,
    **health: Any,
) -> Options:
    """Validate every option; raise ValueError naming the option, the value and what is allowed.

    ``init_params`` are the parameter names of ``wandb.init`` (when wandb is importable), used
    to reject misspelled ``**wandb_init_kwargs`` early; ``health`` are the node-health options.
    """
    if project is not None:
        _str_or_none("project", project)
        if len(project) > 128 or _BAD_PROJECT_CHARS.search(project):
            raise invalid("project", project, "W&B project names are at most 128 characters without / \\ # ? % :")
    _check_choices(
        nodes=nodes,
        offline_transfer=offline_transfer,
        log_config=log_config,
        strategy=strategy,
        rank_metrics=rank_metrics,
        upload_checkpoints=upload_checkpoints,
        config=config,
    )
    gpu_device_ids = _gpu_ids(gpu_device_ids)
    _check_key(api_key, api_key_file)
    kwargs, settings = _init_kwargs(wandb_init_kwargs, init_params)

    return Options(
        project=project,
        entity=_str_or_none("entity", entity),
        group=_str_or_none("group", group),
        name=_str_or_none("name", name),
        tags=_str_tuple("tags", tags),
        notes=notes if notes is None else str(notes),
        config=dict(config or {}),
        log_config=log_config,
        excludes=_str_tuple("excludes", excludes),
        mode=resolve_mode(mode, env_mode),
        nodes=nodes,
        sampling_interval_s=_positive_seconds("sampling_interval_s", sampling_interval_s, minimum=0.1),
        gpu_device_ids=gpu_device_ids,
        init_timeout_s=_positive_seconds("init_timeout_s", init_timeout_s),
        finish_timeout_s=_positive_seconds("finish_timeout_s", finish_timeout_s),
        offline_transfer=offline_transfer,
        strategy=strategy,
        rank_metrics=rank_metrics,
        upload_checkpoints=upload_checkpoints,
        upload_timeout_s=_positive_seconds("upload_timeout", upload_timeout),
        wandb_init_kwargs=kwargs,
        settings=settings,
        **fleet_options(**health),
    )


def fleet_options(
    *,
    straggler_metric: Any = None,
    straggler_mode: Any = "max",
    straggler_threshold: Any = 0.7,
    straggler_window_s: Any = 120.0,
    alerts: Any = True,
    max_node_writers: Any = 256,
) -> dict[str, Any]:
    """The node-health options (the straggler rule and W&B alerts) and the writer cap, validated."""
    m = max_node_writers
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise invalid(
            "max_node_writers", m, "expected a whole number of node writers, at least 1 (W&B tests 300 a run)"
        )
    if straggler_mode not in STRAGGLER_MODES:
        raise invalid("straggler_mode", straggler_mode, "expected 'max' (higher is better) or 'min' (lower is better)")
    t = straggler_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= 1:
        raise invalid("straggler_threshold", t, "expected a number in (0, 1]: the fraction of the other nodes' median")
    if not isinstance(alerts, bool):
        raise invalid("alerts", alerts, "expected True or False")
    return {
        "straggler_metric": _str_or_none("straggler_metric", straggler_metric),
        "straggler_mode": straggler_mode,
        "straggler_threshold": float(t),
        "straggler_window_s": _positive_seconds("straggler_window_s", straggler_window_s),
        "alerts": alerts,
        "max_node_writers": m,
    }


def _check_choices(
    *,
    nodes: Any,
    offline_transfer: Any,
    log_config: Any,
    strategy: Any,
    rank_metrics: Any,
    upload_checkpoints: Any,
    config: Any,
) -> None:
    if nodes not in NODE_SELECTIONS:
        raise invalid("nodes", nodes, f"expected one of {', '.join(repr(n) for n in NODE_SELECTIONS)}")
    if offline_transfer not in OFFLINE_TRANSFERS:
        raise invalid(
            "offline_transfer", offline_transfer, f"expected one of {', '.join(repr(t) for t in OFFLINE_TRANSFERS)}"
        )
    if not isinstance(log_config, bool):
        raise invalid("log_config", log_config, "expected True or False")
    if strategy not in STRATEGIES:
        raise invalid("strategy", strategy, f"expected one of {', '.join(repr(s) for s in STRATEGIES)}")
    if rank_metrics not in RANK_METRICS:
        raise invalid("rank_metrics", rank_metrics, f"expected one of {', '.join(repr(r) for r in RANK_METRICS)}")
    if not isinstance(upload_checkpoints, bool):
        raise invalid("upload_checkpoints", upload_checkpoints, "expected True or False")
    if config is not None and not isinstance(config, Mapping):
        raise invalid("config", config, "expected a dict of extra run config or None")


def _gpu_ids(gpu_device_ids: Any) -> tuple[int, ...] | None:
    if gpu_device_ids is not None:
        ids = (
            tuple(gpu_device_ids)
            if isinstance(gpu_device_ids, Iterable) and not isinstance(gpu_device_ids, str)
            else None
        )
        if ids is None or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise invalid(
                "gpu_device_ids",
                gpu_device_ids,
                "expected a list of GPU indices >= 0 (as nvidia-smi numbers them) or None",
            )
        gpu_device_ids = ids
    return gpu_device_ids  # type: ignore[no-any-return]


def _check_key(api_key: Any, api_key_file: Any) -> None:
    if api_key is not None and api_key_file is not None:
        raise ValueError(
            "ray_wandb_nodes: both api_key and api_key_file were given; pass only one of them "
            "(the key itself is not shown here)"
        )
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ValueError("ray_wandb_nodes: invalid api_key (not shown); expected a non-empty string")
    if api_key_file is not None and (not isinstance(api_key_file, str) or not api_key_file):
        raise invalid("api_key_file", api_key_file, "expected the path of a file holding the W&B API key")


def _init_kwargs(
    wandb_init_kwargs: Mapping[str, Any] | None, init_params: Sequence[str] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``**wandb_init_kwargs`` to pass on, and the user's ``settings`` fields, validated."""
    kwargs = dict(wandb_init_kwargs or {})
    for key in kwargs:
        if key in _OWNED_INIT_KWARGS:
            use = _OWNED_INIT_KWARGS[key]
            how = f"use the callback's {use}= option" if use else "the plugin manages it for each writer"
            raise invalid(key, kwargs[key], f"{key} is not passed through to wandb.init; {how}")
        if init_params is not None and key not in init_params:
            raise invalid(key, kwargs[key], f"it is not a wandb.init parameter (those are: {', '.join(init_params)})")
    if isinstance(kwargs.get("dir"), str) and kwargs["dir"]:
        kwargs["dir"] = os.path.abspath(kwargs["dir"])  # the driver's working directory, not a node's
    settings = _settings_dict(kwargs.pop("settings", None))
    if "id" in kwargs:
        _str_or_none("id", kwargs["id"])
    return kwargs, settings
