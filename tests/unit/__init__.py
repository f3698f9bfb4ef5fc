"""Unit tests: pure logic, and the real wandb client against the test backend; no Ray cluster."""
