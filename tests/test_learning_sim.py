"""The closed loop learns through the simulated culture: the README's quickstart, run as a user runs it, for longer.

`spikeloop train experiments/quickstart.yaml` as a subprocess (a private local Ray, a real env runner playing
VizDoom, the simulated culture as its own device program, as fast as possible, the default learner), with only
its output directory moved and its budget doubled. The perfect channel's test (tests/test_learning.py) shows the
learner learns; this one shows the culture path does: encoder -> stimulation -> simulated spikes -> decoder.
A run repeats bit for bit on one machine, not across machines (README "Repeatable runs"), and this seed's rise
starts late: at the quickstart's 20,000 env steps it had risen on one machine (2026-11-26: last 100 episodes
kill rate 0.93, return -459.9) and not on another (2026-11-27: 0.67, -523.1), so a test at that budget passes or
fails by machine. At 40,000 on the second machine: first 100 episodes kill rate 0.64 and return -526.7, last 100
0.97 and -467.1 (1,200 episodes), hence the budget and the margins.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.support.spikeloop_cli import run_spikeloop

WINDOW = 100
CHANCE_KILL_RATE_AT_MOST = 0.8
TRAINED_KILL_RATE_AT_LEAST = 0.85
RETURN_GAIN_AT_LEAST = 30.0
"""Last 100 episodes' mean return over the first 100's, at least (measured: 59.6 at 40,000 env steps)."""
ENV_STEPS = 40_000
"""Twice the quickstart's budget: this seed had risen by 20,000 env steps on one machine, by 30,000 on the other."""


@pytest.mark.slow
@pytest.mark.timeout(2700)
@pytest.mark.long  # about 10 minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_the_quickstart_learns_basic_through_the_simulated_culture(tmp_path: Path) -> None:
    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            "--set",
            f"stop.env_steps={ENV_STEPS}",
            "--set",
            f"output.root_dir={tmp_path / 'runs'}",
        ],
        timeout=2400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    files = list((tmp_path / "runs").glob("quickstart-*/*/episodes.jsonl"))
    assert len(files) == 1, files
    episodes = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    assert len(episodes) >= 3 * WINDOW, f"only {len(episodes)} episodes"
    first, last = episodes[:WINDOW], episodes[-WINDOW:]
    kill_first = sum(e["kill_count"] > 0 for e in first) / WINDOW
    kill_last = sum(e["kill_count"] > 0 for e in last) / WINDOW
    return_first = statistics.fmean(e["episode_reward"] for e in first)
    return_last = statistics.fmean(e["episode_reward"] for e in last)
    report = (
        f"first {WINDOW} episodes: kill rate {kill_first:.2f}, return {return_first:.1f}; last {WINDOW}: "
        f"{kill_last:.2f}, {return_last:.1f}; {len(episodes)} episodes"
    )
    assert kill_first <= CHANCE_KILL_RATE_AT_MOST, "the untrained loop already kills too often: " + report
    assert kill_last >= TRAINED_KILL_RATE_AT_LEAST, "the loop did not learn basic through the culture: " + report
    assert return_last >= return_first + RETURN_GAIN_AT_LEAST, "the return did not rise: " + report
