"""The driver side of a W&B run: the Train run on the controller and the Tune runs on the driver,
each run's session, its primary writer and what it writes (reports, config, checkpoints, hangs,
failures, health and rank tables), the Train/Tune hand-off. Runs in the Train controller or the Tune driver."""

# Each module's public names are the package's interface (they were top-level modules).
__all__ = [
    "failure_writes",
    "handoff",
    "hang_writes",
    "primary",
    "primary_commands",
    "primary_index",
    "ray_hangs",
    "run_files",
    "session",
    "train_controller",
    "train_failures",
    "train_run",
    "train_workers",
    "trial_relay",
    "tune_rows",
    "tune_run",
]
