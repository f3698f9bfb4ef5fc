"""The unit tests' one rule beyond the shared fixtures: none of them starts Ray.

A Ray instance started in the pytest process (by a plugin thread asking Ray something, which
auto-starts a local instance) adds Ray's own threads, which read the environment while tests
change it: a race in the C library that ends the whole run with a segmentation fault.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _ray_not_started(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.node.nodeid} started Ray in the test process; unit tests run without Ray")
