"""Unit tests of the fleet thread, its plan, pool, node loggers and hang watch (`_fleet`)."""
