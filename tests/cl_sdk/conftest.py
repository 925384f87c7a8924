"""Tests against the cl-sdk simulator: run only where `cl` imports (Python 3.12 + cl-sdk).

The main Python 3.11 run skips this folder; `scripts/cl_sdk_tests.sh` runs it.
"""

import os

import pytest

pytest.importorskip("cl", reason="cl-sdk is not installed (needs Python 3.12); run scripts/cl_sdk_tests.sh")

# No websocket visualisation server in tests; a fixed seed for the simulator's data.
os.environ.setdefault("CL_SDK_VISUALISATION", "0")
os.environ.setdefault("CL_SDK_RANDOM_SEED", "1234")
