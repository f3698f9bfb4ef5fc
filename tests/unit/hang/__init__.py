"""Unit tests of the hang core: beacon, evidence, dumps, verdict, node watch (`_hang`)."""
