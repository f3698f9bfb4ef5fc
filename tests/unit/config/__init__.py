"""Unit tests of the options table, its checks and the captured secrets (`_config`)."""
