"""The session record through `spikeloop train` (long tier): a run killed with SIGKILL, and a run exported to NWB.

* `spikeloop train experiments/cl1.yaml` against `spikeloop device` in its own process (recording its own
  JSONL), read while it runs; once the record holds some steps, the driver's process group (driver, its local
  Ray, the env runner that writes the record) is SIGKILLed. The record then opens, was never closed, and holds
  every stimulation the device received, in order, up to within the flush interval of the kill.
* `spikeloop train experiments/quickstart.yaml` runs one short iteration; `spikeloop export nwb RUN_DIR` turns its
  record into NWB, which nwbinspector passes with no CRITICAL or BEST_PRACTICE_VIOLATION finding.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from spikeloop.models.closed_loop.session_record import find_records, read_record
from tests.support.hardware_rig import REPO, DevicePorts, DeviceProgram, spikeloop_argv, spikeloop_export_nwb, user_env
from tests.support.process_tree import group_and_descendants, sigkill_all

pytestmark = pytest.mark.long  # each is a Ray run of minutes on 2 cores

FLUSH_S = 1.0
SLACK_S = 3.0
"""What a loaded 2-core machine may add to the flush interval: the timer thread waits for its turn to run."""
STEPS_BEFORE_KILL = 40
RAY_START = {"RAY_raylet_start_wait_time_s": "300"}
"""Ray's node start gives up after 60 s by default, which a loaded 2-core test machine can exceed."""
SHORT = [
    *("--set", "ppo.train_batch_size_per_learner=64"),
    *("--set", "ppo.minibatch_size=32"),
    *("--set", "ppo.num_epochs=1"),
    *("--set", "loop.timeout_s=1.0"),
]


def committed_steps(run_root: Path) -> int:
    """Steps the run's record holds so far (0 until it exists); read while the run writes it."""
    records = find_records(next(iter(run_root.glob("*")), run_root)) if run_root.exists() else []
    if not records:
        return 0
    try:
        return len(read_record(records[0])[1]["steps"]["step"])
    except (OSError, ValueError):
        return 0  # met a flush half-way: read again


def test_kill_9_of_train_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    ports = DevicePorts()
    device_rec = tmp_path / "device-recording"
    device = DeviceProgram(
        ["spikeloop", "device", "--backend", "sim", "--realtime", "--recording-path", str(device_rec)]
        + ports.device_flags(),
        tmp_path / "device.log",
    )
    root = tmp_path / "runs"
    log = tmp_path / "train.log"
    argv = spikeloop_argv(
        ["spikeloop", "train", "experiments/cl1.yaml", *ports.experiment_sets(), *SHORT]
        + ["--set", "stop.iterations=1000", "--set", f"output.root_dir={root}"]
        + ["--set", f"output.record_flush_s={FLUSH_S}"]
    )
    with log.open("w") as out:
        driver = subprocess.Popen(
            argv, cwd=REPO, env=user_env(**RAY_START), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 420
        while committed_steps(root) < STEPS_BEFORE_KILL:
            assert driver.poll() is None, log.read_text()[-6000:]
            assert time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.5)
        time.sleep(FLUSH_S * 0.6)  # somewhere inside a flush interval
    finally:
        sigkill_all(group_and_descendants(driver.pid))  # the driver, its local Ray, the env runner: no cleanup
        killed_at = time.time()
        driver.wait(timeout=30)
        device.stop()
    assert driver.returncode == -signal.SIGKILL

    (record,) = find_records(next(root.glob("cl1-*")))
    attrs, tables = read_record(record)
    assert "closed_wall_time_s" not in attrs, "the writer closed the file: it was not killed"
    assert attrs["device_id"] == "cl1-a" and "devices:" in attrs["experiment_yaml"]
    stim, spikes, steps = tables["stim"], tables["spikes"], tables["steps"]
    assert len(steps["step"]) >= STEPS_BEFORE_KILL
    assert steps["step"].tolist() == list(range(1, len(steps["step"]) + 1))
    assert spikes["stim_timestamp_us"].tolist() == stim["stim_timestamp_us"].tolist()[: len(spikes["wall_time_s"])]
    assert int(steps["stim_rows"][-1]) <= len(stim["wall_time_s"])

    # What the device received, in order; the record holds a prefix of it, short by at most the last flush.
    (jsonl,) = [p for p in device_rec.glob("device-*.jsonl") if not p.name.endswith(".events.jsonl")]
    lines = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    received = [entry["timestamp_us"] for entry in lines if entry["kind"] == "stim"]
    recorded = stim["stim_timestamp_us"].tolist()
    assert recorded == received[: len(recorded)], "the record's stimulations are not the device's, in order"
    last_recorded_s = float(stim["wall_time_s"][-1])
    lost_s = killed_at - last_recorded_s
    assert lost_s < FLUSH_S + SLACK_S, f"the record ends {lost_s:.1f} s before the kill"
    # At the device's 10 steps/s, what came after the last flush is a few seconds' worth at most.
    assert len(received) - len(recorded) <= 10 * (FLUSH_S + SLACK_S) + 2, (len(received), len(recorded))

    # A killed run's record exports too.
    export = spikeloop_export_nwb(str(record.parent.parent))
    assert export.returncode == 0, export.stderr
    assert record.with_suffix(".nwb").is_file()


def test_export_nwb_of_a_short_run_passes_nwbinspector(tmp_path: Path) -> None:
    from nwbinspector import Importance, inspect_nwbfile
    from pynwb import NWBHDF5IO

    root = tmp_path / "runs"
    train = subprocess.run(
        spikeloop_argv(["spikeloop", "train", "experiments/quickstart.yaml", *SHORT])
        + ["--set", "stop.iterations=1", "--set", f"output.root_dir={root}"],
        cwd=REPO,
        env=user_env(**RAY_START),
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert train.returncode == 0, (train.stdout + train.stderr)[-6000:]
    run_dir = next(root.glob("quickstart-*"))
    export = spikeloop_export_nwb(str(run_dir), "--species", "Mus musculus", "--age", "P21D")
    assert export.returncode == 0, export.stderr
    (record,) = find_records(run_dir)
    nwb = record.with_suffix(".nwb")
    assert f"wrote {nwb}" in export.stdout
    findings = [
        f"{m.importance.name} {m.check_function_name}: {m.message}"
        for m in inspect_nwbfile(nwbfile_path=str(nwb))
        if m.importance in (Importance.CRITICAL, Importance.BEST_PRACTICE_VIOLATION)
    ]
    assert not findings, findings
    attrs, tables = read_record(record)
    assert "closed_wall_time_s" in attrs  # a run that ended closed its record
    episodes = [json.loads(line) for line in next(run_dir.glob("*/episodes.jsonl")).read_text().splitlines()]
    with NWBHDF5IO(str(nwb), "r") as io:
        f = io.read()
        assert len(f.intervals["stimulation"]) == len(tables["stim"]["wall_time_s"]) >= 64
        assert f.trials["episode"].data[:].tolist() == [e["episode_index"] for e in episodes]
        assert f.processing["behavior"]["reward"].data.shape == (len(tables["steps"]["step"]),)
        assert f.subject.species == "Mus musculus"
