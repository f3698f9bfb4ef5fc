"""Unit tests of the command line's offline report and sync (`report`)."""
