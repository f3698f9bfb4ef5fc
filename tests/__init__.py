"""The test suite: a package, so that test modules, ``tests.support`` and the train loops that
Ray workers import all have one module name each, from the repository root."""
