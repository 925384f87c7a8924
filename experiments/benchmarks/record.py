"""What every benchmark result file carries besides its figures, and how it is written."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

SOURCE_TREE = Path(__file__).resolve().parents[2]
"""The checkout this code runs from (a benchmark's figures belong to its commit)."""


def provenance(name: str, argv: list[str] | None) -> dict[str, Any]:
    """The command that measured, the commit it ran, the machine it ran on and when."""
    return {
        "command": " ".join(["spikeloop", "bench", name, *(argv or [])]),
        "git": git_state(SOURCE_TREE),
        "machine": machine(),
        "measured_at": utc_now(),
    }


def machine() -> dict[str, Any]:
    """The machine a measurement ran on: CPUs, Python and platform."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def utc_now() -> str:
    """The time now, as the result files write it (UTC, ISO 8601)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a benchmark's JSON (creating docs/benchmarks/ if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def git_state(tree: Path) -> dict[str, Any] | None:
    """The commit `tree` is checked out at and whether its tracked files differ from it (None: not a git checkout)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "tracked_files_changed": bool(changed)}
