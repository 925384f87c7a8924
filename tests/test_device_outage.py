"""A device that goes away mid-run and comes back (issue 26, outages), as a lab meets it.

The device program is `spikeloop device` in its own process on ports the test chose; `spikeloop train` is a
subprocess with its own local Ray. The device is frozen mid-run (SIGSTOP), the run stops on the loss
(`loop.on_device_loss: stop`), the device carries on (SIGCONT) and `spikeloop train --resume` finishes the run's
budget from the checkpoint the trial saved at the loss: episode numbers and TensorBoard steps carry on, no episode
is lost or numbered twice, and the device's one recording marks what the lost iteration left in it (the
`discarded` event), so that each episode number stands there once. With `loop.on_device_loss: wait` the same run
pauses instead, probes the device until it is back and finishes its budget in one go; the outage is in
TensorBoard, in the episode it fell in and in that episode's `episode_end` to the device. And the device program outlives a `training_complete`
that says the trainer stopped on an error, unless told otherwise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from spikeloop.bridge.device.recording import read_recording
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.discarded import standing_episodes
from spikeloop.bridge.wire.protocol import EventMessage, StimCommand, decode_spikes, encode_event, encode_stim
from spikeloop.experiments.analysis.replay import load_record_session
from tests.support.hardware_rig import (
    REPO,
    DevicePorts,
    DeviceProgram,
    spikeloop_argv,
    spikeloop_export_nwb,
    user_env,
    wait_for_log_text,
)
from tests.support.readme_commands import readme_argv
from tests.support.tensorboard_events import event_scalars

ITERATIONS = 5
TRAIN = "spikeloop train experiments/cl1.yaml"
RESUME = "spikeloop train --resume experiments/cl1.yaml"
WAIT = "spikeloop train --set loop.on_device_loss=wait"
RUN_TIMEOUT_S = 420
DEVICE = ["spikeloop", "device", "--backend", "sim", "--as-fast-as-possible"]
PACED_DEVICE = ["spikeloop", "device", "--backend", "sim"]  # a CL1's pace: 10 steps/s
BATCH = 64  # env steps per iteration
SHORT = [
    *("--set", f"ppo.train_batch_size_per_learner={BATCH}"),
    *("--set", "ppo.minibatch_size=32"),
    *("--set", "ppo.num_epochs=1"),
    *("--set", "env.reset_delay_s=0"),
    *("--set", "output.step_log=false"),
    *("--set", f"stop.iterations={ITERATIONS}"),
    # No periodic checkpoint before the end: the one --resume continues from is the one saved at the loss.
    *("--set", "checkpoint.every_iterations=1000"),
    *("--set", "loop.timeout_s=1.0"),  # a loaded 2-core machine can starve even an unpaced device for a moment
    *("--set", "loop.max_consecutive_timeouts=3"),
]
RESUMED = re.compile(r"resumed from (\S+) at iteration (\d+)")
PROGRESS = re.compile(r"\[iter (\d+)\]")


def _episodes(trial_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (trial_dir / "episodes.jsonl").read_text().splitlines() if line.strip()]


def _recorded_events(recording: Path) -> list[dict]:
    """The events the device has recorded so far (a line it is writing just now left out)."""
    events = []
    for path in recording.glob("*.events.jsonl"):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _recorded_stamps(recording: Path) -> list[int]:
    """The stamps of the stimulations the device has recorded so far."""
    stamps = []
    for path in recording.glob("*.jsonl"):
        if not path.name.endswith(".events.jsonl"):
            for line in path.read_text().splitlines():
                if '"kind": "stim"' in line and line.endswith("}"):
                    stamps.append(json.loads(line)["timestamp_us"])
    return sorted(stamps)


def _wait_for_an_unlogged_episode_end(recording: Path, log: Path) -> bool:
    """Until the device heard an episode end in the iteration under way, with steps of it still to come.

    Issue 51's case: the iteration the loss discards ended an episode, whose number the resumed run gives again.
    The device is paced (10 steps/s): with 10 steps of the iteration to come there is a second to freeze it in.
    Past the third iteration it stops waiting: the last iteration stays ahead either way.
    """
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while f"[iter {ITERATIONS - 1}]" not in log.read_text():
        stamps = _recorded_stamps(recording)
        done = len(PROGRESS.findall(log.read_text())) * BATCH  # the logged iterations' (cl1.yaml: 1 round a step)
        if len(stamps) > done and len(stamps) - done < BATCH - 10:
            ends = [e["timestamp_us"] for e in _recorded_events(recording) if e["event_type"] == "episode_end"]
            if ends and max(ends) > stamps[done]:
                return True
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    return False


@pytest.mark.long  # two runs of `spikeloop train`, each with its own Ray start: minutes on 2 cores
@pytest.mark.timeout(1200)
def test_stop_on_device_loss_then_resume_finishes_the_budget(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    ports = DevicePorts()
    root = tmp_path / "runs"
    settings = [*ports.experiment_sets(), *SHORT, "--set", f"output.root_dir={root}"]
    argv = readme_argv(TRAIN) + settings
    recording = tmp_path / "recording"
    device = DeviceProgram(
        PACED_DEVICE + ports.device_flags() + ["--recording-path", str(recording)], tmp_path / "device.log"
    )
    request.addfinalizer(device.stop)  # frozen or not, whatever fails below (SIGTERM, then SIGKILL)
    first_log = tmp_path / "train-1.log"
    try:
        with first_log.open("w") as out:
            first = subprocess.Popen(
                spikeloop_argv(argv), cwd=REPO, env=user_env(), stdout=out, stderr=subprocess.STDOUT, text=True
            )
        wait_for_log_text(first_log, "[iter 2]", first, RUN_TIMEOUT_S)  # two whole iterations answered
        caught = _wait_for_an_unlogged_episode_end(recording, first_log)
        # Now the device stalls (a stuck host, a cut link): lost to the trainer.
        os.killpg(device.proc.pid, signal.SIGSTOP)
        first.wait(timeout=RUN_TIMEOUT_S)
        # It comes back as it was, recording on: it takes in what the lost iteration sent it, then the resume.
        os.killpg(device.proc.pid, signal.SIGCONT)
    finally:
        if first.poll() is None:
            first.kill()
    text = first_log.read_text()
    assert first.returncode == 1, text[-6000:]
    assert "1 of 1 trial(s) stopped because a device was lost" in text, text[-6000:]
    (run_dir,) = root.glob("cl1-*")
    (trial,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    lost_at = max(int(n) for n in PROGRESS.findall(text))
    assert 2 <= lost_at < ITERATIONS, text[-6000:]
    before = _episodes(trial)
    assert before and not (trial / "trial_ended.json").exists()

    # The lab resumes the run; the device stayed up through the training_complete that named the error.
    try:
        resume = subprocess.run(
            spikeloop_argv(readme_argv(RESUME) + settings),
            cwd=REPO,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        output = resume.stdout + resume.stderr
        assert resume.returncode == 0, output[-6000:]
        told = device.summary()  # the run completed: the device heard so and exited by itself
    finally:
        device.stop()
    assert told["exit_reason"] == "training_complete" and told["event_training_complete"] == 2, told
    assert told["stim"] > 0 and told["training_complete_after_error"] == 1, told
    assert told["event_discarded"] == 1, told

    # From the checkpoint saved at the loss (the last whole iteration), not from scratch, not from the start.
    ((_, restored_at),) = RESUMED.findall(output)
    assert int(restored_at) == lost_at, output[-6000:]
    assert f"its recording after iteration {lost_at} is discarded" in output, output[-6000:]
    assert sorted(int(n) for n in PROGRESS.findall(output)) == list(range(lost_at + 1, ITERATIONS + 1))
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert "device_lost" not in summary and summary["errored"] == 0, summary
    assert json.loads((trial / "trial_ended.json").read_text())["reason"] == "stopped"

    # One unbroken episode numbering: nothing lost, nothing numbered twice; iterations and steps carry on.
    episodes = _episodes(trial)
    assert episodes[: len(before)] == before
    after = episodes[len(before) :]
    assert after, "the resumed run logged no episode"
    assert [e["episode_index"] for e in episodes] == list(range(1, len(episodes) + 1))
    # Iterations carry on after the loss (the progress lines above show each from lost_at + 1). The first resumed
    # iteration need not end an episode: its 64 env steps start a fresh one, and `basic` episodes last up to 75.
    assert all(e["iteration"] > lost_at for e in after), after
    assert max(e["iteration"] for e in episodes) == ITERATIONS
    steps = [e["env_steps_lifetime"] for e in episodes]
    assert steps == sorted(steps) and after[0]["env_steps_lifetime"] > before[-1]["env_steps_lifetime"]
    # TensorBoard: one point per iteration, its step the env-step count, rising across the loss and the resume.
    points = event_scalars(trial)["episode/env_steps_lifetime"]
    assert len(points) == ITERATIONS, points
    tb_steps = [step for step, _ in points]
    assert tb_steps == sorted(set(tb_steps)), points

    # The device's one recording: the trainer told it what the lost iteration left there (issue 51), so every
    # episode number stands once, as in episodes.jsonl, and the discarded stimulations are marked.
    stims, events = read_recording(recording)
    (discard,) = [e for e in events if e["event_type"] == "discarded"]
    assert discard["data"]["kept_iteration"] == lost_at and discard["data"]["reason"] == "resume", discard
    assert discard["data"]["episodes_from"] == len(before) + 1, discard
    assert standing_episodes(events) == [e["episode_index"] for e in episodes], events
    heard = [e for e in events if e["event_type"] == "episode_end"]
    assert len(heard) == len(episodes) + sum(e["discarded"] for e in heard), heard  # only the lost copies drop
    if caught:  # the lost iteration ended an episode: its number was heard twice, the first copy is marked
        assert any(e["discarded"] for e in heard), heard
    dropped = [s for s in stims if s["discarded"]]
    assert len(dropped) >= 3, dropped  # at least the stimulations that timed out while the device was frozen
    assert max(s["timestamp_us"] for s in dropped) < discard["timestamp_us"], (dropped[-1], discard)
    # The trainer's session records (one per attempt) say it too: replay and the NWB export leave the copy out.
    from pynwb import NWBHDF5IO

    session = load_record_session(trial)
    assert [int((session.episode == e["episode_index"]).sum()) for e in episodes] == [
        e["episode_length"] for e in episodes
    ], (session.files, episodes)
    export = spikeloop_export_nwb(str(run_dir))
    assert export.returncode == 0, export.stderr
    standing, thrown = [], 0
    for record in sorted((trial / "record").glob("*.h5")):
        with NWBHDF5IO(str(record.with_suffix(".nwb")), "r") as io:
            trials = io.read().trials
            for number, marked in zip(trials["episode"].data[:], trials["discarded"].data[:]):
                standing += [] if marked else [int(number)]
                thrown += int(marked)
    assert standing == [e["episode_index"] for e in episodes], standing
    assert thrown == sum(f["discarded_episodes"] for f in session.files)
    # What stands is what the learner got: each kept env step's stimulations (rounds of one frame), nothing else.
    rounds = yaml.safe_load((trial / "experiment.yaml").read_text())["model"]["same_frame_rounds"]
    assert len(stims) - len(dropped) == tb_steps[-1] * rounds, (len(stims), len(dropped), tb_steps)


WAIT_ITERATIONS = 5  # the episode the outage fell in ends well inside the budget
WAITING = "as loop.on_device_loss is 'wait'"


@pytest.mark.long  # one run of `spikeloop train` and two device programs: minutes on 2 cores
@pytest.mark.timeout(1200)
def test_wait_on_device_loss_rides_out_a_restart_and_finishes_the_budget(tmp_path: Path) -> None:
    ports = DevicePorts()
    root = tmp_path / "runs"
    settings = [
        *ports.experiment_sets(),
        *SHORT,
        *("--set", f"stop.iterations={WAIT_ITERATIONS}"),
        *("--set", f"loop.max_wait_s={RUN_TIMEOUT_S}"),  # the README's 900 s would outlast the test's own limits
        *("--set", f"output.root_dir={root}"),
    ]
    log = tmp_path / "train.log"
    device = DeviceProgram(DEVICE + ports.device_flags(), tmp_path / "device-1.log")
    recording = tmp_path / "recording"
    run: subprocess.Popen | None = None
    try:
        with log.open("w") as out:
            run = subprocess.Popen(
                spikeloop_argv(readme_argv(WAIT) + settings),
                cwd=REPO,
                env=user_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        wait_for_log_text(log, "[iter 2]", run, RUN_TIMEOUT_S)
        device.kill()
        wait_for_log_text(log, WAITING, run, RUN_TIMEOUT_S)  # the env step found it lost and waits, probing
        # The lab starts the device again on the same ports; the waiting trial finds it by itself.
        device = DeviceProgram(
            DEVICE + ports.device_flags() + ["--recording-path", str(recording)], tmp_path / "device-2.log"
        )
        run.wait(timeout=RUN_TIMEOUT_S)
        told = device.summary()  # the run completed: the device heard so and exited by itself
    finally:
        device.stop()
        if run is not None and run.poll() is None:
            run.kill()
    text = log.read_text()
    assert run.returncode == 0, text[-6000:]
    assert "answered again after" in text, text[-6000:]
    assert told["exit_reason"] == "training_complete" and told["event_training_complete"] == 1, told
    assert told["stim"] > 0 and told.get("training_complete_after_error", 0) == 0, told
    assert sorted(int(n) for n in PROGRESS.findall(text)) == list(range(1, WAIT_ITERATIONS + 1)), text[-6000:]
    (run_dir,) = root.glob("cl1-*")
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert "device_lost" not in summary and summary["errored"] == 0, summary
    (trial,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    assert json.loads((trial / "trial_ended.json").read_text())["reason"] == "stopped"

    # One run, one unbroken episode numbering; the episode the outage fell in says so, and only it.
    episodes = _episodes(trial)
    assert [e["episode_index"] for e in episodes] == list(range(1, len(episodes) + 1))
    assert [e["iteration"] for e in episodes] == sorted(e["iteration"] for e in episodes)
    spanned = [e for e in episodes if e["device_outages"]]
    assert [e["device_outages"] for e in spanned] == [1], spanned
    assert spanned[0]["device_outage_s"] > 0 and spanned[0]["iteration"] > 2, spanned
    assert all(e["device_outage_s"] == 0 for e in episodes if e is not spanned[0])
    # The restarted device heard it in that episode's episode_end (it keeps the events with its recording).
    (events_file,) = recording.glob("*.events.jsonl")
    ends = [json.loads(line) for line in events_file.read_text().splitlines()]
    heard = [e["data"] for e in ends if e["event_type"] == "episode_end" and "device_outages" in e["data"]]
    assert [(e["episode"], e["device_outages"]) for e in heard] == [(spanned[0]["episode_index"], 1)], ends
    # TensorBoard: one outage, with the time waited for it.
    scalars = event_scalars(trial)
    assert len(scalars["episode/env_steps_lifetime"]) == WAIT_ITERATIONS, scalars["episode/env_steps_lifetime"]
    assert scalars["device/outages"][-1][1] == 1, scalars["device/outages"]
    assert scalars["device/outage_s"][-1][1] > 0, scalars["device/outage_s"]
    steps = [e["env_steps_lifetime"] for e in episodes]
    assert steps == sorted(steps)


def _send_event(port: int, seq: int, data: dict) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(encode_event(EventMessage(seq, "training_complete", data)), ("127.0.0.1", port))


def _answers(ports: DevicePorts, rx: socket.socket, ts: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.sendto(encode_stim(StimCommand(ts, (10.0,) * N_ENCODING, (1.5,) * N_ENCODING)), ("127.0.0.1", ports.stim))
    return decode_spikes(rx.recv(64)).timestamp_us == ts


def _wait_for_text(device: DeviceProgram, text: str) -> None:
    deadline = time.monotonic() + 30
    while text not in device.text():
        assert time.monotonic() < deadline, device.text()[-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("exit_on_error", [False, True], ids=["stays-up", "exit-on-error-complete"])
def test_device_program_outlives_an_error_training_complete_unless_told(tmp_path: Path, exit_on_error: bool) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(10)
    ports = DevicePorts(spike=rx.getsockname()[1])
    flags = ["--exit-on-error-complete"] if exit_on_error else []
    device = DeviceProgram(
        ["spikeloop", "device", "--backend", "zero", "--as-fast-as-possible", *ports.device_flags(), *flags],
        tmp_path / "device.log",
    )
    try:
        assert _answers(ports, rx, 1)
        _send_event(ports.event, 2, {"reason": "error: a trial failed", "total_steps": 64})
        if exit_on_error:
            summary = device.summary(timeout=30)
            assert summary["exit_reason"] == "training_complete" and summary["event_training_complete"] == 1
            assert "training_complete_after_error" not in summary, summary
            return
        _wait_for_text(device, "training_complete after an error")
        assert device.proc.poll() is None and _answers(ports, rx, 3)  # still up, still answering
        _send_event(ports.event, 4, {"reason": "completed", "total_steps": 128})
        summary = device.summary(timeout=30)
    finally:
        device.stop()
        rx.close()
    assert summary["exit_reason"] == "training_complete", summary
    assert summary["event_training_complete"] == 2 and summary["training_complete_after_error"] == 1, summary
    assert summary["stim"] == summary["replies"] == 2, summary
