"""Unit tests of the offline folder: index, packing, transfer (`offline`)."""
