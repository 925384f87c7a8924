"""The device's stimulation modes: spikeloop's tick-long burst, and the reference device's interrupt + one pulse.

What one stimulation command does to the simulated culture (in process, over real UDP, the culture's burst
schedule read back), that the setting reaches the device from its flag and from the experiment file, and that a
bad value is refused with its key. The cl backend's commands are tested against cl-sdk in tests/cl_sdk.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.backends import STIM_MODES, stim_charge_nc, stim_pulses
from spikeloop.bridge.device.program import Device, DeviceConfig, build_parser, config_from_args
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import (
    ENCODING_ELECTRODES,
    FORBIDDEN_ELECTRODES,
    N_ENCODING,
    POSITIVE_FEEDBACK_ELECTRODES,
    STIM_AMPLITUDE_RANGE_UA,
    STIM_FREQUENCY_RANGE_HZ,
    STIMULABLE_ELECTRODES,
    TICK_FREQUENCY_HZ,
)
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import (
    EventMessage,
    FeedbackCommand,
    FeedbackType,
    encode_event,
    encode_feedback,
)
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict, load_experiment
from tests.support.loopback_trainer import LoopbackTrainer

ROOT = Path(__file__).resolve().parent.parent
FEEDBACK_PULSES = 30


@pytest.fixture
def trainer() -> Iterator[LoopbackTrainer]:
    t = LoopbackTrainer(timeout_s=10.0)
    yield t
    t.close()


def test_pulses_per_command_in_each_mode() -> None:
    assert STIM_MODES == ("burst", "reference")
    # burst: one 100 ms tick at the frequency, at least one pulse
    assert [stim_pulses(f, 10.0, "burst") for f in (4.0, 15.0, 40.0, 200.0)] == [1, 2, 4, 20]
    # reference: one pulse whatever the frequency
    assert [stim_pulses(f, 10.0, "reference") for f in (4.0, 15.0, 40.0, 200.0)] == [1, 1, 1, 1]
    assert stim_pulses(0.0, 10.0, "reference") == 0 and stim_pulses(0.0, 10.0, "burst") == 0  # 0 Hz is off
    with pytest.raises(ValueError, match="stim_mode='sideways'"):
        stim_pulses(10.0, 10.0, "sideways")


def test_charge_table_in_architecture_md_is_what_the_code_computes() -> None:
    envelope = SafetyEnvelope()
    # One pulse at the envelope's largest amplitude carries exactly its per-phase charge limit (3 uA x 120 us).
    one_pulse_nc = stim_charge_nc(envelope.effective_max_amplitude_ua, 1.0, TICK_FREQUENCY_HZ, "reference")
    assert one_pulse_nc == pytest.approx(envelope.max_charge_per_phase_nc)
    points = {
        "safety envelope's limits": (envelope.effective_max_amplitude_ua, envelope.max_frequency_hz),
        "encoder's top": (STIM_AMPLITUDE_RANGE_UA[1], STIM_FREQUENCY_RANGE_HZ[1]),
        "encoder's bottom": (STIM_AMPLITUDE_RANGE_UA[0], STIM_FREQUENCY_RANGE_HZ[0]),
    }
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for name, (amplitude_ua, frequency_hz) in points.items():
        cells = []
        for mode in STIM_MODES:
            pulses = stim_pulses(frequency_hz, TICK_FREQUENCY_HZ, mode)
            charge_nc = stim_charge_nc(amplitude_ua, frequency_hz, TICK_FREQUENCY_HZ, mode)
            assert charge_nc <= pulses * envelope.max_charge_per_phase_nc + 1e-9  # no pulse beyond the limit
            noun = "pulse" if pulses == 1 else "pulses"
            cells.append(f"{pulses} {noun}, {charge_nc:.3g} nC (both phases {2 * charge_nc:.3g} nC)")
        row = f"| {name} | {amplitude_ua:g} uA | {frequency_hz:g} Hz | {' | '.join(cells)} |"
        assert row in doc, f"docs/architecture.md should have this row (the code computes it):\n{row}"


def _after_feedback_then_stimulation(trainer: LoopbackTrainer, stim_mode: str) -> np.ndarray:
    """Pulses still scheduled per electrode ~1 ms after: a 30-pulse feedback burst, then one stimulation."""
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=trainer.spike_port)
    device = Device(
        DeviceConfig(
            address=address,
            backend="sim",
            seed=2,
            realtime=False,
            artifact_wait_ms=0.0,
            collect_window_ms=1.0,
            stim_mode=stim_mode,  # type: ignore[arg-type]
        )
    )
    thread = device.start()
    try:
        feedback = FeedbackCommand(1, FeedbackType.REWARD, POSITIVE_FEEDBACK_ELECTRODES, 20, 2.0, FEEDBACK_PULSES)
        trainer.tx.sendto(encode_feedback(feedback), ("127.0.0.1", device.feedback_port))
        deadline = time.monotonic() + 5.0
        while device.counters["feedback"] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert device.counters["feedback"] == 1
        trainer.exchange(device.stim_port, 7, (40.0,) * N_ENCODING, (2.0,) * N_ENCODING)
        return device.backend.culture._pulse_remaining.copy()  # type: ignore[attr-defined]
    finally:
        device.stop()
        thread.join(5)
        device.close()


def test_burst_mode_sends_a_tick_long_burst_and_stops_nothing(trainer: LoopbackTrainer) -> None:
    remaining = _after_feedback_then_stimulation(trainer, "burst")
    # 40 Hz for one 100 ms tick = 4 pulses per encoding electrode; at most one fired in the 1 ms window
    assert all(remaining[e] >= 3 for e in ENCODING_ELECTRODES), remaining[list(ENCODING_ELECTRODES)]
    # the feedback burst carries on
    assert all(remaining[e] >= FEEDBACK_PULSES - 1 for e in POSITIVE_FEEDBACK_ELECTRODES)


def test_reference_mode_interrupts_every_electrode_then_gives_one_pulse(trainer: LoopbackTrainer) -> None:
    remaining = _after_feedback_then_stimulation(trainer, "reference")
    # one pulse per encoding electrode (fired at once), and the feedback burst was interrupted with the rest
    assert remaining[list(STIMULABLE_ELECTRODES)].sum() == 0, remaining
    assert len(STIMULABLE_ELECTRODES) == 59 and not FORBIDDEN_ELECTRODES & set(STIMULABLE_ELECTRODES)


def test_device_flag_reaches_the_backend_and_bad_values_are_refused() -> None:
    args = build_parser().parse_args(["--stim-mode", "reference", "--stim-port", "0", "--event-port", "0"])
    config = config_from_args(args)
    assert config.stim_mode == "reference"
    assert config_from_args(build_parser().parse_args([])).stim_mode == "burst"
    with pytest.raises(ValueError, match="stim_mode='sideways'"):
        DeviceConfig(stim_mode="sideways")  # type: ignore[arg-type]
    # A burst lasts one tick: at 0.5 Hz a 200 Hz burst would be 400 pulses, over the envelope's 200 ...
    with pytest.raises(ValueError, match="max_pulses"):
        DeviceConfig(tick_frequency_hz=0.5)
    # ... one pulse per command never is
    assert DeviceConfig(tick_frequency_hz=0.5, stim_mode="reference").stim_mode == "reference"
    assert "--stim-mode" in build_parser().format_help()


def test_device_program_says_its_mode_and_answers(trainer: LoopbackTrainer) -> None:
    stim_port, event_port, feedback_port = free_port(), free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "spikeloop.experiments.cli",
        "device",
        "--backend",
        "sim",
        "--stim-mode",
        "reference",
        "--as-fast-as-possible",
        "--stim-port",
        str(stim_port),
        "--event-port",
        str(event_port),
        "--feedback-port",
        str(feedback_port),
        "--spike-port",
        str(trainer.spike_port),
    ]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60.0  # the culture compiles and matures before the ports answer
        counts = None
        while counts is None and time.monotonic() < deadline:
            trainer.rx.settimeout(1.0)
            try:
                counts = trainer.exchange(stim_port, 5, (20.0,) * N_ENCODING, (2.0,) * N_ENCODING)
            except TimeoutError:
                assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert counts is not None and counts.shape == (8,)
        trainer.tx.sendto(encode_event(EventMessage(9, "training_complete", {})), ("127.0.0.1", event_port))
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert "backend=sim stim_mode=reference" in stderr
    bad = subprocess.run(command[:6] + ["sideways"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--stim-mode" in bad.stderr and "sideways" in bad.stderr


def test_experiment_file_sets_it_for_simulated_devices_and_checks_it() -> None:
    experiment = experiment_from_dict({"devices": [{"backend": "sim", "stim_mode": "reference"}]})
    device = experiment.culture_settings().simulated_device_for(0)
    assert device.device_config(0, SafetyEnvelope()).stim_mode == "reference"
    assert experiment_from_dict({}).devices[0].stim_mode == "burst"
    with pytest.raises(ExperimentError, match=r"devices\.0\.stim_mode"):
        experiment_from_dict({"devices": [{"backend": "sim", "stim_mode": "sideways"}]})
    reference = load_experiment(ROOT / "experiments" / "reference.yaml")
    assert reference.devices[0].stim_mode == "reference"
