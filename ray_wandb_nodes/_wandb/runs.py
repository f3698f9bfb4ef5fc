"""The only place that calls ``wandb.init``: shared by the primary and the node writers."""

from __future__ import annotations

import os
import warnings
from typing import Any

from .._gpu_ids import lookup_on_node
from .writers import WriterSpec


def init_writer(spec: WriterSpec, *, log_brought_in: bool = False, **overrides: Any) -> Any:
    """Start one writer as ``spec`` says and repeat the step-metric definitions.

    Every writer repeats ``define_metric``: in shared mode each writer's config sync can
    replace the run's metric definitions (last writer wins), so they must all agree.
    ``log_brought_in``: its transaction log is what the run's end brings into the run (an
    offline writer's; a relayed writer's, should its relay die): see
    :func:`brought_in_log_settings`.
    """
    import wandb

    # A WANDB_SERVICE inherited from another process would attach this writer to that
    # process's wandb-core; every writer starts its own.
    os.environ.pop("WANDB_SERVICE", None)
    settings = dict(spec.settings)
    if "x_stats_pid" not in settings:  # a writer that samples a chosen process (Tune) keeps it
        settings.update(raylet_tree_settings(wandb.Settings))
    if log_brought_in:
        settings.update(brought_in_log_settings(wandb.Settings, settings))
    if spec.gpu_ids:  # one rank's GPUs, as NVML indices on this node (UUIDs looked up here)
        indices = lookup_on_node(spec.gpu_ids)
        if indices is not None:
            settings["x_stats_gpu_device_ids"] = list(indices)
        else:
            warnings.warn(
                f"ray_wandb_nodes: the GPUs {', '.join(spec.gpu_ids)} of the writer {spec.label} have no NVML index "
                "on this node (a MIG device, or NVML not found): it samples every GPU of the node",
                stacklevel=2,
            )
    if spec.api_key is not None:
        settings["api_key"] = spec.api_key.reveal()
    share_host_with_process(wandb, settings)
    kwargs = {**spec.init_kwargs, **overrides}
    run = wandb.init(**kwargs, reinit="create_new", settings=wandb.Settings(**settings))
    run.define_metric(spec.step_metric)
    run.define_metric("*", step_metric=spec.step_metric)
    return run


def share_host_with_process(wandb: Any, settings: dict[str, Any]) -> None:
    """Make the writer's W&B host and key the process's too.

    Some of what a run does reads the process's wandb settings, not the run's: on wandb 0.28 and
    0.29 each table logged again under its key (the node and GPU tables are) asks the host in
    ``WANDB_BASE_URL`` for its version and looks the previous table's artifact up with the
    process's settings. A Ray worker inherits none of the driver's W&B environment, so those calls
    went to the default W&B host, without a key, and retried until they timed out while the
    writer's thread waited on them (a self-hosted server's run asked the public one). A process
    whose own ``WANDB_BASE_URL`` names another host (a driver whose runs were sent elsewhere by
    the callback's settings) keeps it. A writer with no host of its own (the default W&B host)
    still gives the process its key. A writer's proxy (``https_proxy``, ``http_proxy``: the
    user's, or the relay's) becomes the process's too: the Python API objects wandb makes for a
    table copy the process's settings, not the run's (wandb/wandb#10082: a table hung on a
    proxy given to ``init`` alone).
    """
    base_url = settings.get("base_url")
    if base_url and os.environ.get("WANDB_BASE_URL", base_url) != base_url:
        return
    if base_url:
        os.environ["WANDB_BASE_URL"] = base_url
    shared = {k: settings[k] for k in ("base_url", "api_key", "https_proxy", "http_proxy") if settings.get(k)}
    if shared:  # with no host of its own, the default W&B host: the key still goes with it
        wandb.setup(settings=wandb.Settings(**shared))


# How often a writer's transaction log is flushed where the run's end brings its series in from
# it (a relayed or an offline writer's): well within the wait a relayed writer's finish is given
# once its relay is gone (_fleet/hosted.py RELAY_LOST_FINISH_S, 5 s), so that each sample it took
# is on its node's disk when that log is collected. A flush with nothing new writes nothing.
BROUGHT_IN_FLUSH_S = 1.0


def brought_in_log_settings(settings_cls: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """A writer whose transaction log is what the run's end brings into the run (a relayed
    writer's, should its relay die; an offline writer's, its only copy): the log flushed every
    ``BROUGHT_IN_FLUSH_S`` (or the writer's own setting, where shorter), so that it holds each
    sample within a second of its taking.

    wandb-core writes the log a 32 KiB block at a time: each block as it fills, and the one in
    progress every ``x_transaction_log_flush_interval`` (15 s by default; a setting of wandb 0.31
    and later: before, only at the run's end). A client that never reaches its end (its relay
    died, so its finish never returns; its process was killed) takes what it had not flushed
    with it. wandb before 0.31 has no such setting: {} there, and the samples of its block in
    progress are lost with it (``docs/egress.md`` says so)."""
    key = "x_transaction_log_flush_interval"
    if key not in getattr(settings_cls, "model_fields", {}):
        return {}
    own = settings.get(key)
    return {key: min(float(own), BROUGHT_IN_FLUSH_S) if own else BROUGHT_IN_FLUSH_S}


def raylet_tree_settings(settings_cls: Any) -> dict[str, Any]:
    """In a Ray worker process: sample the CPU and memory of the whole Ray process tree of
    this node (the raylet and every worker, train workers included), not of this process.

    wandb's ``cpu`` is then the share of the node's CPUs that Ray's processes use, which is
    what a node's row should show; a logger actor alone uses next to none.
    """
    fields = getattr(settings_cls, "model_fields", {})
    if "x_stats_track_process_tree" not in fields:
        return {}
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as f:
            if not f.read().startswith("raylet"):
                return {}
    except OSError:
        return {}
    return {"x_stats_pid": parent, "x_stats_track_process_tree": True}


def health_table(columns: list[str], rows: list[list[Any]]) -> Any:
    """A ``wandb.Table`` of the health rows, built without wandb's per-cell type inference.

    ``wandb.Table(data=...)`` infers and checks a type for every cell (about 0.1 ms a cell): a
    minute's ``gpus`` table of 512 rows cost the primary's thread some 50 to 130 ms. The rows
    here are plain numbers, strings and None, and their columns mixed (None or a number), so the
    table is made empty with ``allow_mixed_types`` (every column of any type) and handed its rows.
    """
    import wandb

    table = wandb.Table(columns=list(columns), allow_mixed_types=True)
    table.data = [list(row) for row in rows]
    return table
