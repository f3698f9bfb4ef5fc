"""Unit tests of the relay, its allow-list, the reachability check, proxy settings (`_egress`)."""
