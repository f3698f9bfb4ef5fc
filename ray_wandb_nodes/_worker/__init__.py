"""What runs inside the train workers: the set-up before the train function, the frameworks'
patches (their own W&B runs quieted, their long phases and saves, the step anatomy's hooks), and
the import hook that patches a module whether it is imported before or after the set-up."""

# Each module's public names are the package's interface (they were top-level modules).
__all__ = ["frameworks", "on_import", "phases", "setup", "step_inputs", "steps"]
