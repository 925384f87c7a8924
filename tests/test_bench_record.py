"""Every benchmark file names the commit it measured and whether the checkout differed from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from spikeloop.experiments.benchmarks.record import SIMD_FLAGS, SOURCE_TREE, git_state, provenance


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=True).stdout.strip()


def test_provenance_names_the_command_and_the_commit_of_this_checkout() -> None:
    record = provenance("learning", ["--seeds", "5"])
    assert record["command"] == "spikeloop bench learning --seeds 5"
    assert record["git"]["commit"] == _git(SOURCE_TREE, "rev-parse", "HEAD")
    # Runs repeat on one machine, not across CPUs: the file says which CPU it was.
    cpu = record["machine"]
    assert cpu["cpus"] >= 1 and cpu["cpu_model"] and cpu["cpu_model"] != "unknown"
    assert cpu["packages"]["torch"] and cpu["packages"]["ray"]  # the installs a run's numbers depend on
    if Path("/proc/cpuinfo").exists():
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        assert cpu["cpu_simd"] == [f for f in SIMD_FLAGS if f in flags.split(":", 1)[1].split()]


def test_git_state_sees_changed_tracked_files_and_no_checkout(tmp_path: Path) -> None:
    assert git_state(tmp_path) is None  # not a git checkout: nothing to name
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = git_state(tmp_path)
    assert clean == {"commit": _git(tmp_path, "rev-parse", "HEAD"), "tracked_files_changed": False}
    (tmp_path / "a.txt").write_text("two\n")
    (tmp_path / "untracked.txt").write_text("scratch\n")
    assert git_state(tmp_path)["tracked_files_changed"] is True
