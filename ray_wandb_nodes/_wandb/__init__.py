"""The writer kit the primary and the node loggers share: the one ``wandb.init``, each writer's
settings, strategies, metrics and names, checkpoint artifacts and their uploads, the reader of wandb's
transaction log, and the sync of an offline run into its online run."""

# Each module's public names are the package's interface (they were top-level modules).
__all__ = ["artifacts", "metrics", "naming", "runs", "strategies", "sync", "txlog", "uploads", "writers"]
