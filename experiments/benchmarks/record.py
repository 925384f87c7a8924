"""What every benchmark result file carries besides its figures, and how it is written."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def provenance(name: str, argv: list[str] | None) -> dict[str, Any]:
    """The command that measured, the machine it ran on and when."""
    return {
        "command": " ".join(["spikeloop", "bench", name, *(argv or [])]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a benchmark's JSON (creating docs/benchmarks/ if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
