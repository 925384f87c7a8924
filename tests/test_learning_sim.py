"""The closed loop learns through the simulated culture: the README's quickstart, run as a user runs it.

`spikeloop train experiments/quickstart.yaml` as a subprocess (a private local Ray, a real env runner playing
VizDoom, the simulated culture as its own device program, as fast as possible, the default learner), with only
its output directory moved. The perfect channel's test (tests/test_learning.py) shows the learner learns; this one
shows the culture path does: encoder -> stimulation -> simulated spikes -> decoder. The run is repeatable
(unpaced simulated runs repeat bit for bit, README "Repeatable runs"), so the figures below are this seed's, not a
lucky draw: measured 2026-11-26 (this test, 330 s beside a benchmark), first 100 episodes kill rate 0.73 and return
-508.0, last 100 0.93 and -459.9 (624 episodes; the README's figures; the curve stays near chance until about 17,000
env steps, then rises). Another machine may round differently and play other games, hence the margins.
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
"""Last 100 episodes' mean return over the first 100's, at least (measured: 48.1)."""


@pytest.mark.slow
@pytest.mark.long  # about 5 minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_the_quickstart_learns_basic_through_the_simulated_culture(tmp_path: Path) -> None:
    proc = run_spikeloop(
        ["train", "experiments/quickstart.yaml", "--set", f"output.root_dir={tmp_path / 'runs'}"], timeout=1500
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
