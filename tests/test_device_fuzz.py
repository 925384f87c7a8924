"""Hostile datagrams against the device program, every backend, over loopback UDP (issue 14).

Per backend, 5,000 malformed or hostile datagrams per port (stimulation, feedback,
events) plus forged ones from another address, interleaved with 250 valid
stimulations: the device stays up, answers every valid stimulation with its
timestamp from its stimulation port, accounts for every datagram, never calls
its culture outside its own envelope, keeps bounded counters and a recording
that is valid JSON. The `spikeloop device` process gets the killers from the
issue and must still be serving, then exit 0 on SIGTERM. The cl backend runs
the same fuzz under cl-sdk (tests/cl_sdk/test_cl_fuzz.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.backends.transparent import transparent_counts
from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import StimCommand, decode_spikes, encode_stim
from spikeloop.bridge.wire.safety import SafetyEnvelope
from tests.support.device_fuzz import (
    FOREIGN_HOST,
    _event_bytes,
    fuzz_device,
    outside_envelope,
    recording_is_valid_json,
    settle,
    taken_in,
)

ROOT = Path(__file__).resolve().parents[1]
PER_PORT = 5000
# Narrower than the default so that ordinary-looking values (3 uA, 150 Hz) are outside it too.
ENVELOPE = SafetyEnvelope(
    min_frequency_hz=2.0, max_frequency_hz=120.0, min_amplitude_ua=0.5, max_amplitude_ua=2.6, max_pulses=150
)


def _rx() -> socket.socket:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return rx


def _transparent_check(freqs, amps, counts) -> None:
    np.testing.assert_allclose(counts, transparent_counts(freqs, amps), rtol=1e-6)


@pytest.mark.parametrize("backend", ["sim", "random", "zero", "transparent"])
def test_device_survives_thousands_of_hostile_datagrams_per_port(backend: str, tmp_path: Path) -> None:
    rx = _rx()
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=rx.getsockname()[1])
    device = Device(
        DeviceConfig(
            address=address,
            backend=backend,
            seed=3,
            realtime=False,
            artifact_wait_ms=0.5,
            collect_window_ms=0.5,
            recording_path=tmp_path,
            envelope=ENVELOPE,
        )
    )
    thread = device.start()
    try:
        report = fuzz_device(
            device,
            rx,
            PER_PORT,
            seed=sum(map(ord, backend)),
            check_counts=_transparent_check if backend == "transparent" else None,
        )
        counters = settle(device, report)
        alive = thread.is_alive() and not device.stopped
    finally:
        device.stop()
        thread.join(10)
        rx.close()
    print(
        f"{backend}: {report.sent} hostile + {report.foreign_sent} foreign datagrams, {report.valid_stims} valid "
        f"stimulations in {report.seconds:.1f} s; counters {counters}"
    )
    assert alive, f"the device stopped: {device.exit_reason}"
    assert all(n == PER_PORT for n in report.sent.values())
    # Every valid stimulation answered, with its own timestamp, from the stimulation port.
    assert report.answered == report.valid_stims and report.wrong_source == 0
    # Every datagram accounted for, none raised inside the device.
    assert taken_in(counters) == sum(report.sent.values()) + sum(report.foreign_sent.values()) + report.valid_stims
    assert not any(k.startswith("errors_") for k in counters), counters
    for kind in ("stim", "feedback", "event"):
        assert counters[f"foreign_{kind}"] == report.foreign_sent[kind]  # forged training_complete included
    assert counters["replies"] == counters["stim"] == report.valid_stims + report.other_replies
    assert counters["refused_stim"] > 0 and counters["refused_feedback"] > 0 and counters["malformed_event"] > 0
    # Nothing outside the device's own envelope reached the culture; bounded counters (1,250 invented event types).
    assert outside_envelope(report, ENVELOPE) == []
    assert report.stim_calls and counters["event_other"] >= PER_PORT // 4 and len(counters) < 30
    assert recording_is_valid_json(device.recording_files()) > 0


def test_spikeloop_device_process_outlives_the_killers_from_the_issue(tmp_path: Path) -> None:
    """The datagrams that used to stop `spikeloop device`, sent to the real process; then SIGTERM exits 0."""
    rx = _rx()
    rx.settimeout(0.2)
    stim_port, event_port, feedback_port = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spikeloop.experiments.cli",
            "device",
            "--backend",
            "sim",
            "--as-fast-as-possible",
            "--stim-port",
            str(stim_port),
            "--event-port",
            str(event_port),
            "--feedback-port",
            str(feedback_port),
            "--spike-port",
            str(rx.getsockname()[1]),
            "--artifact-wait-ms",
            "1",
            "--collect-window-ms",
            "1",
            "--recording-path",
            str(tmp_path),
            "--log-level",
            "ERROR",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=os.environ.copy(),
    )
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    foreign = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    foreign.bind((FOREIGN_HOST, 0))

    def exchange(ts: int, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            tx.sendto(encode_stim(StimCommand(ts, (20.0,) * N_ENCODING, (1.5,) * N_ENCODING)), ("127.0.0.1", stim_port))
            try:
                while True:
                    if decode_spikes(rx.recv(64)).timestamp_us == ts:
                        return True
            except TimeoutError:
                continue
        return False

    try:
        assert exchange(1, 60), "the device did not come up"
        killers = [
            (stim_port, struct_stim(1e20)),
            (stim_port, struct_stim(3.4028234663852886e38)),
            (stim_port, np.random.default_rng(0).bytes(72)),
            (event_port, _event_bytes(b'{"event_type":"x","data":' + b"[" * 2000 + b"]" * 2000 + b"}")),
            (event_port, _event_bytes(b'{"event_type":"episode_end","data":{"r":1e400}}')),
        ]
        for port, datagram in killers:
            tx.sendto(datagram, ("127.0.0.1", port))
        foreign.sendto(_event_bytes(b'{"event_type":"training_complete","data":{}}'), ("127.0.0.1", event_port))
        assert exchange(2, 10), "the device stopped answering after the killers"
        time.sleep(0.3)  # the device drains its event port after its stimulation port: let it get there
        assert exchange(3, 10)
        assert proc.poll() is None
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        for sock in (rx, tx, foreign):
            sock.close()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(err.strip().splitlines()[-1])["spikeloop_device"]
    assert summary["exit_reason"] == "SIGTERM"
    assert summary.get("foreign_event") == 1, summary
    assert summary.get("errors_stim", 0) == 0
    assert summary["malformed_event"] == 2
    assert summary.get("refused_stim", 0) + summary.get("malformed_stim", 0) == 3
    assert recording_is_valid_json([Path(p) for p in summary["recording_files"]]) > 0


def struct_stim(frequency_hz: float) -> bytes:
    """A stimulation with one frequency too large for any culture (packed by hand: the encoder refuses it)."""
    from spikeloop.bridge.wire.protocol import STIM_STRUCT

    return STIM_STRUCT.pack(9, frequency_hz, *([20.0] * (N_ENCODING - 1)), *([1.5] * N_ENCODING))
