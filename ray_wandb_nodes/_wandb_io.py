"""The only place that calls ``wandb.init``: shared by the primary and the node writers."""

from __future__ import annotations

import os
from typing import Any

from ._writers import WriterSpec


def init_writer(spec: WriterSpec, **overrides: Any) -> Any:
    """Start one writer as ``spec`` says and repeat the step-metric definitions.

    Every writer repeats ``define_metric``: in shared mode each writer's config sync can
    replace the run's metric definitions (last writer wins), so they must all agree.
    """
    import wandb

    # A WANDB_SERVICE inherited from another process would attach this writer to that
    # process's wandb-core; every writer starts its own.
    os.environ.pop("WANDB_SERVICE", None)
    settings = dict(spec.settings)
    if spec.api_key is not None:
        settings["api_key"] = spec.api_key.reveal()
    kwargs = {**spec.init_kwargs, **overrides}
    run = wandb.init(**kwargs, reinit="create_new", settings=wandb.Settings(**settings))
    run.define_metric(spec.step_metric)
    run.define_metric("*", step_metric=spec.step_metric)
    return run
