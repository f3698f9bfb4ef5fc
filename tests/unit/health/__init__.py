"""Unit tests of node, GPU and rank rules, their alerts and tables (`_health`)."""
