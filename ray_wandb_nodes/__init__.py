"""ray_wandb_nodes: one W&B run that shows every node of a Ray Train or Tune run.

``from ray_wandb_nodes import WandbNodesCallback`` and add it to
``ray.train.RunConfig(callbacks=[...])``. Importing this package needs neither Ray
initialised nor wandb installed; the callback says what is missing when it is built.
``long_phase`` marks a long phase of a train function's own loop (an evaluation) for hang
detection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["WandbNodesCallback", "WandbNodesTuneCallback", "__version__", "long_phase"]

if TYPE_CHECKING:
    from ._worker.phases import long_phase
    from .train import WandbNodesCallback
    from .tune import WandbNodesTuneCallback


def __getattr__(name: str) -> Any:
    # Lazy, so that `import ray_wandb_nodes` works without Ray's Train V2 internals loaded.
    if name == "WandbNodesCallback":
        from .train import WandbNodesCallback

        return WandbNodesCallback
    if name == "WandbNodesTuneCallback":
        from .tune import WandbNodesTuneCallback

        return WandbNodesTuneCallback
    if name == "long_phase":
        from ._worker.phases import long_phase

        return long_phase
    raise AttributeError(f"module 'ray_wandb_nodes' has no attribute {name!r}")
