"""Unit tests of the step anatomy: region, recorder, windows, attribution (`_steps`)."""
