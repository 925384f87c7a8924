"""A device that goes away mid-run and comes back (issue 26, outages), as a lab meets it.

The device program is `spikeloop device` in its own process on ports the test chose; `spikeloop train` is a
subprocess with its own local Ray. The device is SIGKILLed mid-run, the run stops on the loss
(`loop.on_device_loss: stop`), the device is started again on the same ports, and `spikeloop train --resume`
finishes the run's budget from the checkpoint the trial saved at the loss: episode numbers and TensorBoard steps
carry on, no episode is lost or numbered twice. With `loop.on_device_loss: wait` the same run pauses instead,
probes the device until it is back and finishes its budget in one go; the outage is in TensorBoard, in the episode
it fell in and in that episode's `episode_end` to the device. And the device program outlives a `training_complete`
that says the trainer stopped on an error, unless told otherwise.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.protocol import EventMessage, StimCommand, decode_spikes, encode_event, encode_stim
from tests.support.hardware_rig import (
    REPO,
    DevicePorts,
    DeviceProgram,
    spikeloop_argv,
    user_env,
    wait_for_log_text,
)
from tests.support.readme_commands import readme_argv
from tests.support.tensorboard_events import event_scalars

ITERATIONS = 4
TRAIN = "spikeloop train experiments/cl1.yaml"
RESUME = "spikeloop train --resume experiments/cl1.yaml"
WAIT = "spikeloop train --set loop.on_device_loss=wait"
RUN_TIMEOUT_S = 420
DEVICE = ["spikeloop", "device", "--backend", "sim", "--as-fast-as-possible"]
SHORT = [
    *("--set", "ppo.train_batch_size_per_learner=64"),
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


@pytest.mark.long  # two runs of `spikeloop train`, each with its own Ray start: minutes on 2 cores
@pytest.mark.timeout(1200)
def test_stop_on_device_loss_then_resume_finishes_the_budget(tmp_path: Path) -> None:
    ports = DevicePorts()
    root = tmp_path / "runs"
    settings = [*ports.experiment_sets(), *SHORT, "--set", f"output.root_dir={root}"]
    argv = readme_argv(TRAIN) + settings
    device = DeviceProgram(DEVICE + ports.device_flags(), tmp_path / "device-1.log")
    first_log = tmp_path / "train-1.log"
    try:
        with first_log.open("w") as out:
            first = subprocess.Popen(
                spikeloop_argv(argv), cwd=REPO, env=user_env(), stdout=out, stderr=subprocess.STDOUT, text=True
            )
        wait_for_log_text(
            first_log, "[iter 2]", first, RUN_TIMEOUT_S
        )  # two whole iterations answered; now the device vanishes
        device.kill()
        first.wait(timeout=RUN_TIMEOUT_S)
    finally:
        device.stop()
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

    # The lab restarts the device on the same ports and resumes the run.
    device = DeviceProgram(DEVICE + ports.device_flags(), tmp_path / "device-2.log")
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
    assert told["exit_reason"] == "training_complete" and told["event_training_complete"] == 1, told
    assert told["stim"] > 0 and told.get("training_complete_after_error", 0) == 0, told

    # From the checkpoint saved at the loss (the last whole iteration), not from scratch, not from the start.
    ((_, restored_at),) = RESUMED.findall(output)
    assert int(restored_at) == lost_at, output[-6000:]
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
    assert min(e["iteration"] for e in after) == lost_at + 1
    assert max(e["iteration"] for e in episodes) == ITERATIONS
    steps = [e["env_steps_lifetime"] for e in episodes]
    assert steps == sorted(steps) and after[0]["env_steps_lifetime"] > before[-1]["env_steps_lifetime"]
    # TensorBoard: one point per iteration, its step the env-step count, rising across the loss and the resume.
    points = event_scalars(trial)["episode/env_steps_lifetime"]
    assert len(points) == ITERATIONS, points
    tb_steps = [step for step, _ in points]
    assert tb_steps == sorted(set(tb_steps)), points


WAIT_ITERATIONS = 5  # one more than the stop case: the episode the outage fell in ends well inside the budget
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
