"""Makes the shared fixtures of tests/support/fixtures.py available to every test; no helpers live here.

Test modules import helpers from `tests.support`, never from this file (tests/test_support_layout.py checks).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from tests.support.fixtures import ray_session, runs_root  # noqa: E402, F401  (pytest finds fixtures by name)
