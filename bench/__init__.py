"""Benchmarks, not tests. Run each from the repository root as ``python -m bench.<name>``
(``python -m bench.hook_cost``): ``-m`` puts the root on the path, for ``bench`` and ``tests.support``."""
