"""Unit tests of Ray's internals read into plain values, and the supported releases (`_ray`)."""
