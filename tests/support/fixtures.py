"""Fixtures shared by several test modules; tests/conftest.py makes them available to pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.analysis_runs import short_runs


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance shared by every test in the module."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root directory of the shared short runs (tests/support/analysis_runs.py)."""
    return short_runs(tmp_path_factory)
