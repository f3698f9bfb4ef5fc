"""The callbacks' configuration: the one table of options and their checks, the options page
generated from it, what both callbacks do when built, and the driver's W&B secrets carried to
every node. Imports nothing of the package but the leaves and ``offline``'s transfer kinds."""

# Each module's public names are the package's interface (they were top-level modules).
__all__ = ["checks", "options", "options_doc", "secrets", "setup", "values"]
