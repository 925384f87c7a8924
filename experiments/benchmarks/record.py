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
    """The machine a measurement ran on: CPUs, their model, Python and platform."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_simd": cpu_simd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
    }


RESULT_PACKAGES = ("torch", "ray", "numpy", "numba", "vizdoom", "gymnasium")
"""The installed packages whose versions can change a run's numbers (kernels, sampling, the game)."""


def package_versions() -> dict[str, str | None]:
    """Installed versions of `RESULT_PACKAGES` (None: not installed)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in RESULT_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


SIMD_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
"""Vector extensions torch's CPU kernels choose between: runs repeat bit for bit on one machine, not across these."""


def _cpuinfo(field: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else what platform says)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_simd() -> list[str] | None:
    """Which of `SIMD_FLAGS` the CPU has (None where /proc/cpuinfo is not there to say)."""
    flags = _cpuinfo("flags")
    return None if flags is None else [f for f in SIMD_FLAGS if f in flags.split()]


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
