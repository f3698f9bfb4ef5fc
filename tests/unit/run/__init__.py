"""Unit tests of the driver side's runs: Train and Tune, the primary writer, Ray's hang relay (`_run`)."""
