"""Run the `spikeloop` command line as a user does: a subprocess from the repository root, its own local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_spikeloop(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`spikeloop ARGS...` with output captured; never attaches to a cluster named in RAY_ADDRESS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
