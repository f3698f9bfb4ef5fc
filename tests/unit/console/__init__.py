"""Unit tests of the ranks' console: lines, following files, budget, tailer, sender (`_console`)."""
