"""The cl backend under hostile datagrams (cl-sdk simulator): the same fuzz as tests/test_device_fuzz.py."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.safety import SafetyEnvelope
from tests.support.device_fuzz import fuzz_device, outside_envelope, settle, taken_in

PER_PORT = 5000
ENVELOPE = SafetyEnvelope(
    min_frequency_hz=2.0, max_frequency_hz=120.0, min_amplitude_ua=0.5, max_amplitude_ua=2.6, max_pulses=150
)


def test_cl_device_survives_thousands_of_hostile_datagrams_per_port(tmp_path: Path) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=rx.getsockname()[1])
    device = Device(
        DeviceConfig(
            address=address,
            backend="cl",
            tick_frequency_hz=100.0,
            artifact_wait_ms=2.0,
            collect_window_ms=2.0,
            envelope=ENVELOPE,
        )
    )
    thread = device.start()
    try:
        # cl.open() starts cl-sdk's workers first (seconds on a busy machine); each reply waits at most 5 s.
        deadline = time.monotonic() + 120.0
        while device.backend.neurons is None and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        report = fuzz_device(device, rx, PER_PORT, seed=14)
        counters = settle(device, report, timeout_s=20.0)
        alive = thread.is_alive() and not device.stopped
    finally:
        device.stop()
        thread.join(20)
        rx.close()
    print(
        f"cl: {report.sent} hostile + {report.foreign_sent} foreign datagrams, {report.valid_stims} valid "
        f"stimulations in {report.seconds:.1f} s; counters {counters}"
    )
    assert alive, f"the device stopped: {device.exit_reason}"
    assert report.answered == report.valid_stims and report.wrong_source == 0
    assert taken_in(counters) == sum(report.sent.values()) + sum(report.foreign_sent.values()) + report.valid_stims
    assert not any(k.startswith("errors_") for k in counters), counters
    assert outside_envelope(report, ENVELOPE) == []
    assert device.backend.clamped == 0  # the envelope let nothing through that the cl backend had to cap
