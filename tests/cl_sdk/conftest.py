"""Tests against the cl-sdk simulator: collected only where `cl` imports (Python 3.12 + cl-sdk).

The main Python 3.11 run does not collect this folder; `scripts/cl_sdk_tests.sh`
builds a 3.12 venv and runs it. After every test, no cl-sdk simulator worker
started by this process may still be running: a closed `cl` device stops them.
"""

import importlib.util
import os
import time
from collections.abc import Iterator

import pytest

from spikeloop.bridge.device.backends.cl_reaper import cl_sdk_workers

if importlib.util.find_spec("cl") is None:
    # Not collected at all (not even imported): cl-sdk needs Python 3.12.
    collect_ignore_glob = ["test_*.py"]
else:
    # No websocket visualisation server in tests; a fixed seed for the simulator's data.
    os.environ.setdefault("CL_SDK_VISUALISATION", "0")
    os.environ.setdefault("CL_SDK_RANDOM_SEED", "1234")


@pytest.fixture(autouse=True)
def no_simulator_workers_left() -> Iterator[None]:
    """Fail a test whose closed devices left cl-sdk's workers running in this process."""
    yield
    deadline = time.monotonic() + 10.0  # a stopping producer gets 2 s to notice, then SIGTERM
    while (left := cl_sdk_workers(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"cl-sdk simulator workers still running after the test: {sorted(left)}"
