"""Unit tests of the writer kit (`_wandb`): wandb.init arguments, metrics, naming, strategies,
the transaction-log reader."""
