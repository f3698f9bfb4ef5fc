"""Unit tests of inside train workers: frameworks' wandb.init, the import hook (`_worker`)."""
