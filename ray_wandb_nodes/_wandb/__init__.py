"""The writer kit the primary and the node loggers share: the one ``wandb.init``, each writer's
settings, strategies, metrics and names, checkpoint artifacts and their uploads, and the reader of
wandb's transaction log."""

# Each module's public names are the package's interface (they were top-level modules).
__all__ = ["artifacts", "metrics", "naming", "runs", "strategies", "txlog", "uploads", "writers"]
