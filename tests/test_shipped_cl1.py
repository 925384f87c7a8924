"""`experiments/cl1.yaml` as shipped, against a device program at the real pace: it trains, and the record is true.

A lab's first hardware run. The device program is `spikeloop device --backend sim --realtime` (the README's
command: 50 ms artifact wait + 50 ms collection window, about 10 steps/s) in its own process, recording what
it received; `spikeloop train experiments/cl1.yaml` is a subprocess with only the device's host and ports, the
stop condition and the output directory overridden. So the batch is the shipped 1,024 env steps, and one
iteration takes longer than RLlib's default 60 s sample timeout, which used to starve the learner.

Checked against the device's own recording, which the trainer cannot touch:
- both iterations trained on full batches (2,048 env steps at the learner), and the device was told so;
- every episode in episodes.jsonl is whole: its length is the number of stimulations the device received
  between its `episode_end` event and the one before (the episode running at step 1,024 is cut in two by
  RLlib's sample boundary);
- what the device recorded for each episode (`episode_end`) is what episodes.jsonl says.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.hardware_rig import REPO, DevicePorts, DeviceProgram, spikeloop_argv, user_env
from tests.support.readme_commands import readme_argv

pytestmark = pytest.mark.slow

DEVICE = "spikeloop device --backend sim --realtime"
TRAIN = "spikeloop train experiments/cl1.yaml"
BATCH = yaml.safe_load((REPO / "experiments" / "cl1.yaml").read_text())["ppo"]["train_batch_size_per_learner"]
ITERATIONS = 2


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_cl1_yaml_trains_full_batches_at_the_device_pace_and_records_whole_episodes(tmp_path: Path) -> None:
    ports = DevicePorts()
    recording = tmp_path / "recording"
    root = tmp_path / "runs"
    device = DeviceProgram(
        readme_argv(DEVICE) + ports.device_flags() + ["--recording-path", str(recording)], tmp_path / "device.log"
    )
    try:
        train = subprocess.run(
            spikeloop_argv(
                readme_argv(TRAIN)
                + ports.experiment_sets()
                + ["--set", f"stop.iterations={ITERATIONS}", "--set", f"output.root_dir={root}"]
            ),
            cwd=REPO,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        told = device.summary()
    finally:
        device.stop()
    output = train.stdout + train.stderr
    assert train.returncode == 0, output[-6000:]
    assert BATCH == 1024  # the point of the test: a batch that takes longer than 60 s at 10 steps/s
    assert "NOTHING TRAINED" not in output and "No samples returned" not in output, output[-6000:]
    for i in range(1, ITERATIONS + 1):
        assert f"[iter {i}] episodes" in output and f"env steps {BATCH} " in output, output[-6000:]
    (run_dir,) = root.glob("cl1-*")
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert summary["learner_env_steps"] == ITERATIONS * BATCH and summary["empty_iterations"] == 0, summary

    # The device heard training_complete once, from the driver, with the learner's step count.
    events = _jsonl(next(recording.glob("*.events.jsonl")))
    (complete,) = [e["data"] for e in events if e["event_type"] == "training_complete"]
    assert complete["total_steps"] == ITERATIONS * BATCH and complete["reason"] == "completed", complete
    assert told["exit_reason"] == "training_complete"

    # Whole episodes: each record's length is what the device received between two episode_end events.
    (trial,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    played = {e["episode_index"]: e for e in _jsonl(trial / "episodes.jsonl")}
    ends = [e for e in events if e["event_type"] == "episode_end"]
    assert len(ends) == len(played) >= 10, (len(ends), len(played))
    stim_stamps = sorted(
        r["timestamp_us"]
        for r in _jsonl(next(p for p in recording.glob("*.jsonl") if "events" not in p.name))
        if r["kind"] == "stim"
    )
    assert len(stim_stamps) >= ITERATIONS * BATCH
    previous_end = 0
    for end in ends:
        record = played[end["data"]["episode"]]
        stimulated = sum(1 for t in stim_stamps if previous_end < t < end["timestamp_us"])
        assert record["episode_length"] == stimulated, (record, stimulated)
        assert end["data"]["episode_length"] == stimulated and end["data"]["episode_reward"] == record["episode_reward"]
        previous_end = end["timestamp_us"]
    # Steps after the last episode_end belong to the episode still going when the run stopped.
    unfinished = sum(1 for t in stim_stamps if t > previous_end)
    assert sum(e["episode_length"] for e in played.values()) + unfinished == len(stim_stamps)
