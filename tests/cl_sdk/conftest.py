"""Tests against the cl-sdk simulator: collected only where `cl` imports (Python 3.12 + cl-sdk).

The main Python 3.11 run does not collect this folder; `scripts/cl_sdk_tests.sh`
builds a 3.12 venv and runs it.
"""

import importlib.util
import os

if importlib.util.find_spec("cl") is None:
    # Not collected at all (not even imported): cl-sdk needs Python 3.12.
    collect_ignore_glob = ["test_*.py"]
else:
    # No websocket visualisation server in tests; a fixed seed for the simulator's data.
    os.environ.setdefault("CL_SDK_VISUALISATION", "0")
    os.environ.setdefault("CL_SDK_RANDOM_SEED", "1234")
