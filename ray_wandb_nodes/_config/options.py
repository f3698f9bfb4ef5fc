"""The callbacks' options: one table, and the frozen dataclass it validates into.

``OPTIONS`` is the one place an option is written: its name, its default, its annotation as the
callbacks' signatures show it, its validator, which callbacks take it, its docs section and one
line of doc. The callbacks' signatures and Args sections and docs/options.md follow from it
(``python -m ray_wandb_nodes._config.options_doc`` rewrites the Args sections and the page;
tests/unit/config/test_options.py holds all of them against it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..offline.storage import Transfer
from . import checks as c
from .checks import invalid, mode_value
from .values import (
    AUTO,
    ConsoleMode,
    EgressMode,
    HangTimeout,
    Mode,
    NodeSelection,
    OnHang,
    RankMetrics,
    StragglerMode,
    Strategy,
    literal,
)

__all__ = ["OPTIONS", "Option", "Options", "build_options", "invalid", "resolve_mode"]

TRAIN, TUNE = "train", "tune"
BOTH = (TRAIN, TUNE)
_SAME = object()  # tune_default: as the Train default


@dataclass(frozen=True)
class Option:
    """One row of the table."""

    name: str
    default: Any
    annotation: str  # as the callbacks' signatures write it (a closed set: ``literal`` of its enum)
    check: c.Check
    callbacks: tuple[str, ...]
    section: str  # a key of SECTIONS
    doc: str  # one line: the Args entry of each callback's docstring and the options page
    tune_default: Any = _SAME
    stored: bool = True  # False: a secret, kept in the captured environment, never in Options

    def default_for(self, callback: str) -> Any:
        return self.default if callback == TRAIN or self.tune_default is _SAME else self.tune_default


# Sections of the options page, in order: key -> (title, what the section is about).
SECTIONS = {
    "run": ("The W&B run", "Where the run goes, what it is called and what its config holds."),
    "logging": ("What is logged", "Which runs, which metrics and which nodes' system metrics."),
    "checkpoints": ("Checkpoints", "Reported checkpoints as W&B artifacts."),
    "health": ("Node health", "The live `nodes` table, the straggler rule and its alerts."),
    "hangs": ("Hangs", "A rank that stops while the others wait: named live, with every rank's stacks in the run."),
    "bounds": ("Bounds and scale", "How long the plugin waits, and how many writers join one run."),
    "offline": ("Offline mode", 'With `mode="offline"` every node writes an offline run on its own disk.'),
    "egress": (
        "Nodes without a route to W&B",
        "A node writer checks that it reaches W&B before it joins; what a node that does not reach it does "
        "(see [Clusters without a route to W&B](egress.md)).",
    ),
    "key": ("The W&B key and wandb.init", "The API key never enters the run config, `runtime_env` or a log line."),
}

OPTIONS: tuple[Option, ...] = (
    Option(
        "project", None, "str | None", c.PROJECT, BOTH, "run",
        "the W&B project; None: ``WANDB_PROJECT``, else wandb's default project",
    ),
    Option(
        "entity", None, "str | None", c.TEXT_OR_NONE, BOTH, "run",
        "the W&B entity (team or user); None: ``WANDB_ENTITY``, else your default entity",
    ),
    Option(
        "group", None, "str | None", c.TEXT_OR_NONE, BOTH, "run",
        "the W&B group; None: the Ray run name (Train's ``node`` and ``all`` strategies) or the experiment (Tune)",
    ),
    Option(
        "name", None, "str | None", c.TEXT_OR_NONE, (TRAIN,), "run",
        "the run's display name; None: the Ray run name (``RunConfig.name``)",
    ),
    Option("tags", None, "list[str] | None", c.TEXT_LIST, BOTH, "run", "the run's W&B tags"),
    Option("notes", None, "str | None", c.NOTES, BOTH, "run", "the run's W&B notes"),
    Option(
        "config", None, "dict[str, Any] | None", c.dict_or_none("extra run config"), (TRAIN,), "run",
        "extra run config, merged over the train loop config",
    ),
    Option(
        "log_config", True, "bool", c.BOOLEAN, BOTH, "run",
        "log the config: the train loop config into the run config (Train), each result's ``config`` (Tune)",
        tune_default=False,  # as Ray's WandbLoggerCallback
    ),
    Option(
        "mode", None, f"{literal(Mode)} | None", c.MODE, BOTH, "run",
        "``online``, ``offline`` or ``disabled``; None: ``WANDB_MODE`` (``WANDB_DISABLED=true``: disabled), "
        "else ``online``",
    ),
    Option(
        "excludes", None, "list[str] | None", c.TEXT_LIST, BOTH, "logging",
        "metric keys not to log: a key, or a prefix of nested keys (``opt`` drops ``opt/lr``)",
    ),
    Option(
        "strategy", Strategy.SHARED.value, literal(Strategy), c.choice(Strategy), (TRAIN,), "logging",
        "``shared`` (one run that every node's writer joins), ``main`` (one run, the controller's node only), "
        "``node`` (one run per node, grouped) or ``all`` (one run per rank, grouped)",
    ),
    Option(
        "rank_metrics", RankMetrics.RANK0.value, literal(RankMetrics), c.choice(RankMetrics), (TRAIN,), "logging",
        "what the shared or main run logs of each report: ``rank0`` (rank 0's keys), ``reduce`` (mean, min, max, "
        "std, argmax and argmin rank of every numeric key across ranks) or ``all`` (``rank_<r>/key``)",
    ),
    Option(
        "rank_console", ConsoleMode.RANK0.value, literal(ConsoleMode), c.choice(ConsoleMode), (TRAIN,), "logging",
        "what the shared run's Logs tab holds of what the ranks print (stdout and stderr, read from Ray's worker "
        "log files on each node, labelled ``[rank N]``): ``rank0`` (rank 0's console, and every rank's last lines "
        "when an attempt fails), ``all`` (every rank's), ``failures`` (only every rank's last lines when an "
        "attempt fails) or ``off``",
    ),
    Option(
        "nodes", NodeSelection.WORKERS.value, literal(NodeSelection), c.choice(NodeSelection), BOTH, "logging",
        "``workers``: the nodes hosting train workers (Train) or a trial (Tune); ``cluster``: every alive node, "
        "new ones included",
    ),
    Option(
        "sampling_interval_s", 15.0, "float", c.seconds(minimum=0.1), BOTH, "logging",
        "the system-metric sampling interval on every node",
    ),
    Option(
        "gpu_device_ids", None, "list[int] | None", c.GPU_IDS, BOTH, "logging",
        "the GPU indices to sample on every node; None: all",
    ),
    Option(
        "video_kwargs", None, "dict[str, Any] | None", c.dict_or_none("keyword arguments"), (TUNE,), "logging",
        "keyword arguments of ``wandb.Video`` for video arrays in results (``format`` defaults to ``gif``)",
    ),
    Option(
        "image_kwargs", None, "dict[str, Any] | None", c.dict_or_none("keyword arguments"), (TUNE,), "logging",
        "keyword arguments of ``wandb.Image`` for image arrays in results",
    ),
    Option(
        "upload_checkpoints", False, "bool", c.BOOLEAN, BOTH, "checkpoints",
        "log each reported checkpoint as an artifact (local folders uploaded, remote ones referenced), aliased "
        "``latest`` (and ``best`` in Train)",
    ),
    Option(
        "upload_timeout", 1800.0, "float", c.seconds(), BOTH, "checkpoints",  # Ray's DEFAULT_SYNC_TIMEOUT
        "how long a run's end waits for checkpoint uploads (an abort does not wait for them)",
    ),
    Option(
        "straggler_metric", None, "str | None", c.TEXT_OR_NONE, (TRAIN,), "health",
        "the reported key (flattened: ``samples_per_s``, ``perf/tokens_per_s``) nodes are compared by, a node's "
        "value the median of its ranks'; None: GPU utilisation, or CPU on nodes without GPUs",
    ),
    Option(
        "straggler_mode", StragglerMode.MAX.value, literal(StragglerMode), c.choice(StragglerMode), (TRAIN,), "health",
        "whether a higher (``max``) or a lower (``min``) ``straggler_metric`` is better",
    ),
    Option(
        "straggler_threshold", 0.7, "float", c.FRACTION, BOTH, "health",
        "a node is a straggler once its value stays worse than this fraction of the other nodes' median "
        "(``min``: above the median / threshold)",
    ),
    Option(
        "straggler_window_s", 120.0, "float", c.seconds(), BOTH, "health",
        "for how long (and at least 3 samples) before a node counts as a straggler, or as recovered",
    ),
    Option(
        "alerts", True, "bool", c.BOOLEAN, BOTH, "health",
        "W&B alerts when a node becomes a straggler, recovers or is lost (the ``nodes`` table, the warnings and "
        "``nodes/stragglers`` stay without)",
    ),
    Option(
        "hang_timeout_s", AUTO, f'float | Literal["{AUTO}"] | None', c.HANG_TIMEOUT, (TRAIN,), "hangs",
        "seconds without progress (a report or an optimizer step) after which a rank is hung and every rank's "
        "evidence is taken; ``auto``: max(120 s, 5 x the slowest interval of the last hour), 3 x in the first "
        "step, saves and evaluations, always below the process-group timeout; None: off",
    ),
    Option(
        "on_hang", OnHang.ALERT.value, literal(OnHang), c.choice(OnHang), (TRAIN,), "hangs",
        "what a hang does: ``alert`` (an ERROR alert, the ``hangs`` table and every rank's stacks in the run) or "
        "``restart`` (the same, then the hung attempt is ended so that ``FailureConfig`` restarts it from the "
        "last checkpoint)",
    ),
    Option(
        "init_timeout_s", 90.0, "float", c.seconds(), BOTH, "bounds",
        "how long a writer may take to create or join the run",
    ),
    Option(
        "finish_timeout_s", 60.0, "float", c.seconds(), BOTH, "bounds",
        "the bound on finishing the node writers, then on finishing the run",
    ),
    Option(
        "max_node_writers", 256, "int", c.WRITERS, BOTH, "bounds",
        "at most this many node writers join one shared run (W&B tests about 300 a run); past it, each kind of "
        "node, the lowest ranks and any straggler write, the other nodes are in the ``nodes`` table only, and one "
        "warning says so",
    ),
    Option(
        "offline_transfer", Transfer.AUTO.value, literal(Transfer), c.choice(Transfer), BOTH, "offline",
        "how each node's offline run reaches the driver side at the end: ``ray`` (through Ray, up to 2 GiB a "
        "node), ``storage`` (the run's storage path, which every node must reach) or ``auto`` (the storage unless "
        "it is this machine's local file system, else Ray); a node that cannot use the storage falls back to Ray",
    ),
    Option(
        "egress", EgressMode.DIRECT.value, literal(EgressMode), c.choice(EgressMode), BOTH, "egress",
        "how node writers reach W&B: ``direct`` (each from its own node; a node without a route writes offline "
        "and its series are brought into the run at its end, with one warning) or ``relay`` (a node without a "
        "route sends live through a relay on the Train controller's node, or the Tune driver's)",
    ),
    Option(
        "egress_hosts", None, "list[str] | None", c.EGRESS_HOSTS, BOTH, "egress",
        "with ``egress='relay'``, more hosts the relay tunnels to besides the run's W&B host and its storage "
        "host: ``host`` (port 443), ``host:port``, or ``*.sub.domain`` (its subdomains; never a public suffix "
        "or a whole registrable domain, as the Public Suffix List has them)",
    ),
    Option(
        "api_key", None, "str | None", c.API_KEY, BOTH, "key",
        "the W&B API key; None: ``WANDB_API_KEY``, then the netrc entry; it reaches every node inside the "
        "callback, never through ``runtime_env`` or the run config",
        stored=False,
    ),
    Option(
        "api_key_file", None, "str | None", c.KEY_FILE, BOTH, "key",
        "a file holding the W&B API key (give this or ``api_key``, not both)",
        stored=False,
    ),
    Option(
        "wandb_init_kwargs", None, "Any", c.INIT_KWARGS, BOTH, "key",
        "passed on to the primary's ``wandb.init`` (``job_type``, ``resume``, ``dir``, ...); ``settings`` (a dict "
        "or ``wandb.Settings``) applies to every writer, less the fields that decide each writer's role",
    ),
)  # fmt: skip
BY_NAME = {o.name: o for o in OPTIONS}
VAR_KEYWORD = "wandb_init_kwargs"  # the callbacks' ``**wandb_init_kwargs``
# Arguments a caller may give by position: Tune's in the order of Ray's WandbLoggerCallback.
POSITIONAL = {
    TRAIN: ("project",),
    TUNE: (
        "project", "group", "api_key_file", "api_key", "excludes", "log_config", "upload_checkpoints",
        "upload_timeout", "video_kwargs", "image_kwargs",
    ),
}  # fmt: skip


def options_of(callback: str) -> list[Option]:
    """The options ``callback`` takes, in its signature's order."""
    mine = [o for o in OPTIONS if callback in o.callbacks]
    first = POSITIONAL[callback]
    return sorted(mine, key=lambda o: (first.index(o.name) if o.name in first else len(first), OPTIONS.index(o)))


# wandb.init parameters the plugin sets itself; the user sets them through the named options.
_OWNED_INIT_KWARGS: dict[str, str | None] = {
    **{k: k for k in ("mode", "project", "entity", "group", "name", "tags", "notes", "config")},
    "reinit": None,
}
# Settings fields that decide each writer's role; the plugin owns them.
OWNED_SETTINGS = ("mode", "x_primary", "x_label", "x_update_finish_state", "api_key")


@dataclass(frozen=True)
class Options:
    """Validated options of either callback (the table's stored options, normalised)."""

    project: str | None
    entity: str | None
    group: str | None
    name: str | None
    tags: tuple[str, ...]
    notes: str | None
    config: Mapping[str, Any]
    log_config: bool
    mode: Mode  # resolved: the option, else WANDB_MODE, else online
    excludes: tuple[str, ...]
    strategy: Strategy
    rank_metrics: RankMetrics
    rank_console: ConsoleMode
    nodes: NodeSelection
    sampling_interval_s: float
    gpu_device_ids: tuple[int, ...] | None
    video_kwargs: Mapping[str, Any]
    image_kwargs: Mapping[str, Any]
    upload_checkpoints: bool
    upload_timeout: float
    straggler_metric: str | None
    straggler_mode: StragglerMode
    straggler_threshold: float
    straggler_window_s: float
    alerts: bool
    hang_timeout_s: HangTimeout
    on_hang: OnHang
    init_timeout_s: float
    finish_timeout_s: float
    max_node_writers: int  # node writers of one shared run (see _fleet/cap.py)
    offline_transfer: Transfer
    egress: EgressMode  # how node writers reach W&B (see _egress)
    egress_hosts: tuple[str, ...]  # more hosts the relay tunnels to
    wandb_init_kwargs: Mapping[str, Any]
    settings: Mapping[str, Any]  # from wandb_init_kwargs' ``settings``


def resolve_mode(mode: Mode | str | None, env_mode: str | None) -> Mode:
    """The effective mode: the option (checked already, or as a user writes it), else
    ``WANDB_MODE``, else online."""
    if isinstance(mode, Mode):
        return mode
    if mode is not None:
        return mode_value(mode)
    return mode_value(env_mode, "WANDB_MODE") if env_mode else Mode.ONLINE


def build_options(
    *, env_mode: str | None = None, init_params: Sequence[str] | None = None, callback: str = TRAIN, **values: Any
) -> Options:
    """Validate every option by the table; raise ValueError naming the option, the value and what is allowed.

    Options not given take ``callback``'s defaults. ``init_params`` are the parameter names of
    ``wandb.init`` (when wandb is importable), used to reject misspelled ``**wandb_init_kwargs`` early.
    """
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise TypeError(f"build_options() got unknown options: {', '.join(unknown)}")
    checked = {o.name: o.check(o.name, values.get(o.name, o.default_for(callback))) for o in OPTIONS}
    if checked["api_key"] is not None and checked["api_key_file"] is not None:
        raise ValueError(
            "ray_wandb_nodes: both api_key and api_key_file were given; pass only one of them "
            "(the key itself is not shown here)"
        )
    if checked["egress_hosts"] and checked["egress"] is not EgressMode.RELAY:
        raise invalid(
            "egress_hosts",
            list(checked["egress_hosts"]),
            "the hosts a relay tunnels to apply with egress='relay' only (egress is 'direct': nothing relays)",
        )
    checked["mode"] = resolve_mode(checked["mode"], env_mode)
    checked["wandb_init_kwargs"], checked["settings"] = _init_kwargs(checked["wandb_init_kwargs"], init_params)
    return Options(**{k: v for k, v in checked.items() if k not in BY_NAME or BY_NAME[k].stored})


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


def _init_kwargs(kwargs: dict[str, Any], init_params: Sequence[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``**wandb_init_kwargs`` to pass on, and the user's ``settings`` fields, validated."""
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
        c.TEXT_OR_NONE("id", kwargs["id"])
    return kwargs, settings
