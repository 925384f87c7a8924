"""`spikeloop watch` and `spikeloop checkpoint` on a checkpoint from a real (short) training run.

The watch runs against a cl1 device that is a real UDP `LoopbackDevice` started
here: watch plays its episodes on the local env runner in its own process,
whose local Ray advertises the device's `cl1:<id>` resource itself, so no
cluster setup is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import decode_event
from spikeloop.experiments.commands import checkpoint as checkpoint_command
from spikeloop.experiments.commands import watch as watch_command
from spikeloop.experiments.runner import CHECKPOINT_REQUEST
from spikeloop.experiments.watch_checkpoint import resolve_checkpoint, weight_changes

ROOT = Path(__file__).resolve().parents[1]


def spikeloop(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`spikeloop ...` in a fresh interpreter, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """One training iteration of the quickstart with a checkpoint: run dir, trial dir, checkpoint dir."""
    root = tmp_path_factory.mktemp("runs")
    result = spikeloop(
        "train",
        "experiments/quickstart.yaml",
        "--set",
        "stop.iterations=1",
        "--set",
        "checkpoint.every_iterations=1",
        "--set",
        "ppo.train_batch_size_per_learner=256",
        "--set",
        "ppo.minibatch_size=64",
        "--set",
        "resources.num_env_runners=0",
        "--set",
        f"output.root_dir={root}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = root.glob("quickstart-*")
    (checkpoint,) = run_dir.glob("*/checkpoint_*")
    return {"root": root, "run": run_dir, "trial": checkpoint.parent, "checkpoint": checkpoint}


def cl1_loopback(device: LoopbackDevice, spike_port: int) -> str:
    """A --set that makes the experiment's one device a cl1 device: the loopback device."""
    return (
        f"devices=[{{device_id: watch-loop, backend: cl1, host: 127.0.0.1, stim_port: {device.stim_port}, "
        f"spike_port: {spike_port}, feedback_port: {device.feedback_port}, event_port: {device.event_port}}}]"
    )


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under a directory with its size and mtime: to prove nothing was overwritten."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()}


def events_received(device: LoopbackDevice) -> list:
    """The event datagrams the device received, decoded (after a moment for the last to land)."""
    time.sleep(0.3)
    # The bridge's own status_request events (the device's dose, bridge/trainer/core.py) are not the trainer's events.
    return [e for e in map(decode_event, device.received_events) if e.event_type != "status_request"]


def test_watch_plays_episodes_with_no_weight_change_and_sends_events(trained, tmp_path):
    before = snapshot(trained["run"])
    spike_port = free_port()
    with LoopbackDevice(spike_port=spike_port) as device:
        result = spikeloop(
            "watch",
            str(trained["checkpoint"]),
            "--episodes",
            "2",
            "--set",
            cl1_loopback(device, spike_port),
            "--output",
            str(tmp_path),
        )
        events = events_received(device)
        feedback = list(device.received_feedback)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    for i in (1, 2):
        assert f"[episode {i}/2]" in out
    assert "tensors compared before/after (env runner and learner module): unchanged" in out

    kinds = [e.event_type for e in events]
    assert kinds.count("episode_end") == 2, kinds
    assert kinds[-1] == "training_complete"
    assert events[-1].data["total_episodes"] == 2
    assert [e.data["episode"] for e in events if e.event_type == "episode_end"] == [1, 2]
    assert feedback, "feedback is on by default: episode feedback must reach the device"

    (watch_dir,) = tmp_path.glob("watch-quickstart-*")
    description = yaml.safe_load((watch_dir / "watch.yaml").read_text())
    assert description["checkpoint"] == str(trained["checkpoint"])
    assert description["weights_changed"] == [] and description["weights_compared"] > 0
    assert description["episodes_done"] == 2 and description["feedback"] is True
    records = [json.loads(line) for line in (watch_dir / "episodes.jsonl").read_text().splitlines()]
    assert [r["watch_episode"] for r in records] == [1, 2]
    assert all(r["device_id"] == "watch-loop" and r["timeouts_in_episode"] == 0 for r in records)
    assert snapshot(trained["run"]) == before  # the training run is untouched


def test_watch_without_feedback_sends_events_but_no_feedback(trained):
    spike_port = free_port()
    with LoopbackDevice(spike_port=spike_port) as device:
        result = spikeloop(
            "watch",
            str(trained["trial"]),
            "--episodes",
            "1",
            "--no-feedback",
            "--set",
            cl1_loopback(device, spike_port),
        )
        events = events_received(device)
        assert device.received_stims, "the culture was still in the loop"
        assert device.received_feedback == []
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [e.event_type for e in events] == ["episode_end", "training_complete"]
    # Default output: a new directory beside the training run, under the experiment's output.root_dir.
    (watch_dir,) = trained["root"].glob("watch-quickstart-*")
    assert yaml.safe_load((watch_dir / "watch.yaml").read_text())["feedback"] is False


def test_resolve_checkpoint_from_checkpoint_trial_and_run_dirs(trained, tmp_path):
    assert resolve_checkpoint(trained["checkpoint"]) == trained["checkpoint"]
    assert resolve_checkpoint(trained["trial"]) == trained["checkpoint"]  # newest of the trial
    assert resolve_checkpoint(trained["run"]) == trained["checkpoint"]  # best in summary.yaml
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        resolve_checkpoint(tmp_path)


def test_weight_changes_names_changed_tensors():
    before = {"a": np.zeros(3), "b": np.ones(2)}
    assert weight_changes(before, {k: v.copy() for k, v in before.items()}) == []
    assert weight_changes(before, {"a": np.zeros(3), "b": np.array([1.0, 1.5])}) == ["b"]


def test_checkpoint_request_in_run_and_trial_dirs(trained, tmp_path, capsys):
    for directory in (trained["run"], trained["trial"]):
        assert checkpoint_command.main([str(directory)]) == 0
        assert (directory / CHECKPOINT_REQUEST).is_file()
        assert "will save a checkpoint after its current training iteration" in capsys.readouterr().out
        (directory / CHECKPOINT_REQUEST).unlink()
    assert checkpoint_command.main([str(tmp_path)]) == 1
    assert "is not a run or trial directory" in capsys.readouterr().err
    assert checkpoint_command.main([str(tmp_path / "missing")]) == 1
    assert not (tmp_path / CHECKPOINT_REQUEST).exists()


def test_help_explains_every_flag():
    text = watch_command.build_parser().format_help()
    for flag in ("CHECKPOINT", "--episodes", "--feedback", "--no-feedback", "--explore", "--set", "--output"):
        assert flag in text
    assert "RUN_DIR" in checkpoint_command.build_parser().format_help()
