"""Makes the shared fixtures of tests/support/fixtures.py available to every test; no helpers live here.

It also puts each test in one of two xdist lanes (`--dist loadgroup`, pyproject's addopts): the cases marked
`wall_clock` spend minutes waiting on a device's real pace with the CPU idle, so they run in their own lane
beside the rest of the suite, which keeps one lane and so its order and its one-Ray-session-per-module fixtures.

Test modules import helpers from `tests.support`, never from this file (tests/test_support_layout.py checks).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from tests.support.fixtures import ray_session, runs_root  # noqa: E402, F401  (pytest finds fixtures by name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test in its lane: `wall_clock` or `cpu` (xdist_group; without xdist, as in .venv312, no lanes)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        lane = "wall_clock" if item.get_closest_marker("wall_clock") else "cpu"
        item.add_marker(pytest.mark.xdist_group(lane))
