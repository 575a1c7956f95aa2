"""Shared pytest set-up. Fixtures for the local UltraCluster live in tests/fixtures_localcluster.py."""
from __future__ import annotations

import pytest

pytest_plugins = ["tests.fixtures_localcluster"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Work units for `make test`'s two pytest-xdist workers (--dist loadgroup).

    The end-to-end tests share one Airflow deployment and run in order, so they form one unit.
    Every other module is a unit of its own: a module's fixtures (a local cluster, its slot range
    and accounting port) must never be built twice at once.
    """
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        group = "e2e" if module.startswith("tests/e2e/") else module
        item.add_marker(pytest.mark.xdist_group(group))
