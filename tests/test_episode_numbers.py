"""`episode_end` on the wire: the game's own reward, and one episode count across a killed and resumed driver.

A lab's setup on one machine: `spikeloop device` (random spikes, recording) in its own process, started by the
test, and `spikeloop train` against it as a cl1 device. The driver is SIGKILLed once a checkpoint is recorded,
then `spikeloop train --resume` finishes the run against the same device program. What the device recorded
is read back: every `episode_end` carries the game's reward sum (with `reward_mode: scenario` it is the
episode's reward, never 0 on `basic`), and the resumed driver's episodes continue the count where the run's
episodes.jsonl ended (the reference trainer restores its count the same way), the same numbers as the JSONL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.hardware_rig import DevicePorts
from tests.support.process_tree import group_and_descendants, sigkill_all
from tests.support.spikeloop_cli import REPO, cli_env, recorded_checkpoint

STOP_EPISODES = 10


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "spikeloop.experiments.cli", *args]


def _episodes(trial_dir: Path) -> list[dict]:
    path = trial_dir / "episodes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _episode_ends(recording: Path) -> list[dict]:
    (events,) = recording.glob("*.events.jsonl")
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return [e["data"] for e in lines if e["event_type"] == "episode_end"]


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_episode_end_counts_across_a_resume_and_carries_the_game_reward(tmp_path: Path) -> None:
    ports = DevicePorts()
    recording = tmp_path / "recording"
    device_log = tmp_path / "device.log"
    with device_log.open("w") as log:
        device = subprocess.Popen(
            _cli(
                "device",
                "--backend",
                "random",
                "--as-fast-as-possible",
                "--training-host",
                "127.0.0.1",
                "--recording-path",
                str(recording),
                *ports.device_flags(),
            ),
            cwd=REPO,
            env=cli_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    root = tmp_path / "runs"
    exp = tmp_path / "episodes.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "episodes",
                "devices": [
                    {
                        "device_id": "dish",
                        "backend": "cl1",
                        "host": "127.0.0.1",
                        "stim_port": ports.stim,
                        "spike_port": ports.spike,
                        "event_port": ports.event,
                        "feedback_port": ports.feedback,
                    }
                ],
                "loop": {"timeout_s": 1.0},
                "env": {"scenario": "basic", "frame_skip": 4, "reward_mode": "scenario"},
                "ppo": {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1},
                "stop": {"episodes": STOP_EPISODES},
                "checkpoint": {"every_iterations": 1},
                "output": {"root_dir": str(root)},
            }
        )
    )
    try:
        deadline = time.monotonic() + 120
        while "device up" not in device_log.read_text():
            assert device.poll() is None and time.monotonic() < deadline, device_log.read_text()
            time.sleep(0.2)

        first_log = tmp_path / "first.log"
        with first_log.open("w") as log:
            driver = subprocess.Popen(
                _cli("train", str(exp)),
                cwd=REPO,
                env=cli_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 300
            while True:
                run_dirs = sorted(root.glob("episodes-*"))
                trials = [p for d in run_dirs for p in d.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
                if trials and len(_episodes(trials[0])) >= 2 and recorded_checkpoint(run_dirs):
                    break
                assert driver.poll() is None, f"the run ended before it was killed:\n{first_log.read_text()[-6000:]}"
                assert time.monotonic() < deadline, (
                    f"no episodes and checkpoint in time:\n{first_log.read_text()[-6000:]}"
                )
                time.sleep(0.3)
        finally:
            sigkill_all(group_and_descendants(driver.pid))
            driver.wait(timeout=30)
        (trial_dir,) = trials
        logged_before = len(_episodes(trial_dir))
        sent_before = len(_episode_ends(recording))
        assert sent_before >= logged_before >= 2

        resume = subprocess.run(
            _cli("train", str(exp), "--resume"), cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=400
        )
        assert resume.returncode == 0, (resume.stdout + resume.stderr)[-6000:]
        device.wait(timeout=60)  # training_complete, sent once at the end of the run
    finally:
        if device.poll() is None:
            device.kill()

    logged = _episodes(trial_dir)
    assert [e["episode_index"] for e in logged] == list(range(1, len(logged) + 1))
    assert len(logged) >= STOP_EPISODES
    sent = _episode_ends(recording)
    # Before the kill: the count from 1. After the resume: on from where episodes.jsonl ended, not from 1 again.
    assert [e["episode"] for e in sent[:sent_before]] == list(range(1, sent_before + 1))
    resumed = sent[sent_before:]
    assert [e["episode"] for e in resumed] == list(range(logged_before + 1, logged_before + len(resumed) + 1))
    by_number = {e["episode"]: e for e in resumed}
    for line in logged[logged_before:]:
        event = by_number[line["episode_index"]]
        assert event["episode_reward"] == pytest.approx(line["episode_reward"])
    # The game's own reward (reward_mode scenario: the reward itself); basic pays -1 a tic at least.
    for event in sent:
        assert event["game_reward_sum"] == pytest.approx(event["episode_reward"])
        assert event["game_reward_sum"] != 0
