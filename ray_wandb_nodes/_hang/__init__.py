"""Hangs: each rank's progress beacon, the evidence taken from a rank's process out of band, and
the verdict across ranks.

``beacon`` is the per-rank shared-memory slot (written on the hot path, read by the node's
logger); ``policy`` says when silence is a hang; ``evidence`` arms a rank (faulthandler on a
signal, the flight recorder, a dump thread) and takes its dumps; ``stacks`` and ``flight`` parse
what the dumps hold into typed values; ``verdict`` names who stopped and who waits. Nothing here
imports Ray or wandb: the node loggers, the health monitor and the callbacks drive it.
"""
