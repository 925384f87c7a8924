"""Run the `spikeloop` command line as a user does: a subprocess from the repository root, its own local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TWO_SMALL_ITERATIONS = [
    "--set",
    "stop.iterations=2",
    "--set",
    "ppo.train_batch_size_per_learner=256",
    "--set",
    "ppo.minibatch_size=64",
    "--set",
    "checkpoint.every_iterations=1",
]
"""Overrides for a short run: two iterations of 256 env steps, a checkpoint after each."""
ONE_SMALL_ITERATION = ["--set", "stop.iterations=1", *TWO_SMALL_ITERATIONS[2:]]
"""The same, one iteration."""


def cli_env() -> dict[str, str]:
    """This environment without RAY_ADDRESS (a run starts its own local Ray), usage stats off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def spikeloop_with_sigint(disposition: str, args: list[str]) -> list[str]:
    """The command line for `spikeloop ARGS...` started with SIGINT as a shell leaves it: "default" (a job at the
    terminal) or "ignored" (started in the background by a script, `nohup spikeloop ... &`, which a child inherits).

    A test that signals the process says which, so it does not depend on how its own runner was started.
    """
    handler = {"default": "SIG_DFL", "ignored": "SIG_IGN"}[disposition]
    launch = (
        f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{handler}); "
        "os.execv(sys.executable, [sys.executable, '-m', 'spikeloop.experiments.cli', *sys.argv[1:]])"
    )
    return [sys.executable, "-c", launch, *args]


def run_spikeloop(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`spikeloop ARGS...` with output captured; never attaches to a cluster named in RAY_ADDRESS."""
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", *args],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def recorded_checkpoint(run_dirs: list[Path]) -> bool:
    """Tune's experiment state (what --resume restores) names a trial checkpoint."""
    for run_dir in run_dirs:
        for state in run_dir.glob("experiment_state-*.json"):
            try:
                if "checkpoint_0000" in state.read_text():
                    return True
            except OSError:
                pass
    return False
