"""What each W&B writer gets: the ``wandb.init`` arguments and settings per role (pure).

The primary creates the run (shared mode, ``x_primary=True``); node writers join it
after (``x_primary=False``, ``x_update_finish_state=False``, console off), each with
its own label. Offline runs cannot be shared, so in offline mode every writer writes
its own offline run under the run's id, with the same labels, and the primary's lands in
the run's offline folder (``offline/``), where the node writers' runs join it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from .._config.options import Options
from .._config.secrets import CapturedEnv, Secret
from .._config.values import Mode
from ..offline.index import OfflineIndex, make_private_dir, node_local_dir, offline_folder, open_index

STEP_METRIC = "training_iteration"
# What a writer that is there for system metrics only leaves out.
_SAMPLER_ONLY = {"console": "off", "x_disable_meta": True, "disable_git": True, "save_code": False}

# Samples wandb keeps per writer (``x_stats_buffer_size``): node health reads each writer's
# samples from these, so they are enough for the reads between two pings at any interval.
BUFFER_SAMPLES = 16


class Role(Enum):
    """What a writer is to its run; the value is how an offline run's ``index.json`` names it."""

    PRIMARY = "primary"  # on the driver side: creates the run (shared mode) and owns its final state
    NODE = "node"  # on another node: joins the primary's run for that node's system metrics
    RUN = "run"  # on a node: a run of its own (the node and all strategies), created and finished by it
    OBSERVER = "observer"  # past the run's writer cap: offline, dropped at its end; feeds the node table

    @property
    def joins_shared_run(self) -> bool:
        """One of several writers of a run in wandb's shared mode (online), not a run of its own."""
        return self in (Role.PRIMARY, Role.NODE)


@dataclass(frozen=True)
class WriterSpec:
    """Everything one writer needs to call ``wandb.init``; plain data, picklable."""

    role: Role
    label: str
    init_kwargs: dict[str, Any]
    settings: dict[str, Any]
    api_key: Secret | None = None
    step_metric: str = STEP_METRIC
    # Offline mode: the run's folder on the driver side (see offline/index.py); None otherwise.
    offline_dir: str | None = None
    # The GPUs to sample, as Ray names them (the all strategy's rank); mapped to NVML indices
    # where the writer starts, on the rank's node (see _gpu_ids). Empty: every GPU.
    gpu_ids: tuple[str, ...] = ()

    @property
    def run_id(self) -> str:
        return str(self.init_kwargs["id"])


def _common_settings(options: Options, env: CapturedEnv) -> dict[str, Any]:
    settings = dict(options.settings)
    # wandb's own finish bound; artifacts uploading at the end get upload_timeout.
    finish = (
        max(options.finish_timeout_s, options.upload_timeout)
        if options.upload_checkpoints
        else options.finish_timeout_s
    )
    settings.update(
        x_stats_sampling_interval=options.sampling_interval_s,
        init_timeout=options.init_timeout_s,
        finish_timeout=finish,
    )
    # recent samples kept in wandb's service: the node summaries are read from them
    settings.setdefault("x_stats_buffer_size", BUFFER_SAMPLES)
    if options.gpu_device_ids is not None:
        settings["x_stats_gpu_device_ids"] = list(options.gpu_device_ids)
    if env.base_url:
        settings["base_url"] = env.base_url
    return settings


def _wandb_mode(mode: Mode, shared: bool) -> str:
    """wandb's ``mode`` setting: a run that node writers join online is wandb's ``shared``."""
    return "shared" if shared and mode is Mode.ONLINE else mode.value


def primary_spec(
    options: Options,
    env: CapturedEnv,
    *,
    mode: Mode,
    run_id: str,
    label: str,
    display_name: str | None,
    group: str | None,
    config: dict[str, Any],
    default_dir: str | None,
    shared: bool = True,
) -> WriterSpec:
    """The writer on the driver side that creates the run and owns its final state.

    ``shared=False`` makes a plain run that no other writer joins (the main strategy).
    """
    init_kwargs: dict[str, Any] = {"save_code": False, **options.wandb_init_kwargs}
    init_kwargs.update(
        id=init_kwargs.get("id") or run_id,
        project=options.project or env.project,
        entity=options.entity or env.entity,
        name=options.name or display_name,
        group=options.group or group,
        tags=list(options.tags) or None,
        notes=options.notes,
        config=config,
        resume=init_kwargs.get("resume", "allow"),
    )
    if not init_kwargs.get("dir"):
        init_kwargs["dir"] = env.dir or default_dir
    offline_dir = None
    if mode is Mode.OFFLINE:
        # One folder per run on the driver side; node writers' runs are brought next to it.
        offline_dir = offline_folder(init_kwargs.get("dir") or os.getcwd(), str(init_kwargs["id"]))
        init_kwargs["dir"] = os.path.join(offline_dir, "primary")
    settings = {"console": "off", **_common_settings(options, env)}
    settings.update(mode=_wandb_mode(mode, shared), x_primary=True, x_label=label, x_update_finish_state=True)
    return WriterSpec(
        role=Role.PRIMARY,
        label=label,
        init_kwargs=_drop_none(init_kwargs),
        settings=settings,
        api_key=env.api_key,
        offline_dir=offline_dir,
    )


def run_spec(
    options: Options,
    env: CapturedEnv,
    *,
    mode: Mode,
    run_id: str,
    name: str,
    group: str | None,
    label: str,
    config: dict[str, Any],
    gpu_ids: tuple[str, ...] = (),
    default_dir: str | None = None,
) -> WriterSpec:
    """A run of its own, written from a node's logger actor (the node and all strategies).

    It is created, logged and finished by that one writer, so it is a plain run (not shared);
    ``gpu_ids`` narrows its GPU metrics to one rank's GPUs.
    """
    primary = primary_spec(
        options,
        env,
        mode=mode,
        run_id=run_id,
        label=label,
        display_name=name,
        group=group,
        config=config,
        default_dir=default_dir,
        shared=False,
    )
    init_kwargs = {**primary.init_kwargs, "id": run_id, "name": name}
    return replace(primary, role=Role.RUN, init_kwargs=_drop_none(init_kwargs), gpu_ids=tuple(gpu_ids))


def node_spec(primary: WriterSpec, *, label: str, entity: str | None, project: str | None) -> WriterSpec:
    """A writer that joins the primary's run from another node, only for system metrics.

    ``entity``/``project`` are the ones the primary's run resolved to: run ids are scoped to
    entity and project, so a node writer that guessed them differently would open a new run.
    """
    pk = primary.init_kwargs
    init_kwargs: dict[str, Any] = {
        "id": pk["id"],
        "project": project or pk.get("project"),
        "entity": entity or pk.get("entity"),
        "dir": pk.get("dir"),  # a base folder; see node_dir()
    }
    settings = {k: v for k, v in primary.settings.items() if k != "console"}
    settings.update(x_primary=False, x_update_finish_state=False, x_label=label, **_SAMPLER_ONLY)
    return replace(
        primary,
        role=Role.NODE,
        label=label,
        init_kwargs=_drop_none(init_kwargs),
        settings=settings,
    )


def observer_spec(primary: WriterSpec, *, key: str, label: str) -> WriterSpec:
    """A node's observer past the run's writer cap (see ``_fleet/cap.py``): a writer of its own,
    offline in the node's temp folder and dropped at its end, whose samples only feed the node
    table and the straggler rule. It never reaches W&B, so it needs no key."""
    settings = {
        k: v for k, v in primary.settings.items() if k.startswith("x_stats") or k in ("init_timeout", "finish_timeout")
    }
    settings.update(mode="offline", x_label=label, **_SAMPLER_ONLY)
    init_kwargs = {"id": key, "project": primary.init_kwargs.get("project")}
    return replace(
        primary,
        role=Role.OBSERVER,
        label=label,
        init_kwargs=_drop_none(init_kwargs),
        settings=settings,
        api_key=None,
        offline_dir=None,
    )


def offline_index(spec: WriterSpec) -> OfflineIndex | None:
    """The index of the run folder an offline writer's spec names (None for an online one)."""
    if not spec.offline_dir:
        return None
    k = spec.init_kwargs
    return open_index(
        spec.offline_dir, run_id=spec.run_id, project=k.get("project"), name=k.get("name"), group=k.get("group")
    )


def node_dir(base: str | None, run_id: str, label: str, *, offline: bool = False) -> str:
    """The folder of a node writer, created on its node.

    An offline writer writes in the node's temp folder, from where its run is brought to the
    driver side at the end (see offline/index.py). Writers of one run must not share a folder, so
    an online one gets ``<base>/ray_wandb_nodes/<label>``; where ``base`` is unset or cannot
    be made on that node (the driver's folder rarely exists elsewhere), the node's temp folder.
    """
    if offline:
        path = node_local_dir(run_id, label)
        make_private_dir(path)
        return path
    candidates = [os.path.join(base, "ray_wandb_nodes", label)] if base else []
    candidates.append(os.path.join(tempfile.gettempdir(), "ray_wandb_nodes", run_id, label))
    for path in candidates:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    return candidates[-1]


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
