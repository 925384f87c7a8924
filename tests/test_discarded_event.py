"""The `discarded` event (issue 51) at the device program: recorded, counted, and read back with the marks.

A trainer that throws an iteration away after the device saw it (a lost device, then `--resume`) tells the
device which stimulations and episode numbers no longer stand (docs/protocol.md). Here the test plays the
trainer against `spikeloop device` in its own process: two stimulations and an episode end that stand, one of
each that is then discarded, the event, and the episode's number given again. The recording read back
(`spikeloop.bridge.device.recording.read_recording`) marks the discarded copy, so each number stands once. The
whole run (`spikeloop train`, a frozen device, `--resume`) is tests/test_device_outage.py's long case.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from spikeloop.bridge.device.recording import read_recording
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.discarded import discarded_data, standing_episodes
from spikeloop.bridge.wire.protocol import EventMessage, StimCommand, decode_spikes, encode_event, encode_stim, now_us
from tests.support.hardware_rig import DevicePorts, DeviceProgram


def _stim(ports: DevicePorts, rx: socket.socket) -> int:
    """One stimulation, answered; its stamp."""
    stamp = now_us()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.sendto(encode_stim(StimCommand(stamp, (10.0,) * N_ENCODING, (1.0,) * N_ENCODING)), ("127.0.0.1", ports.stim))
    assert decode_spikes(rx.recv(64)).timestamp_us == stamp
    time.sleep(0.002)  # the next stamp is later
    return stamp


def _event(ports: DevicePorts, event_type: str, data: dict) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.sendto(encode_event(EventMessage(now_us(), event_type, data)), ("127.0.0.1", ports.event))
    time.sleep(0.002)


def _recorded_events(recording: Path, count: int) -> None:
    deadline = time.monotonic() + 30
    while sum(len(p.read_text().splitlines()) for p in recording.glob("*.events.jsonl")) < count:
        assert time.monotonic() < deadline, "the device did not record the events"
        time.sleep(0.05)


def test_device_records_the_discarded_event_and_its_reader_marks_the_copy_that_does_not_stand(
    tmp_path: Path,
) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(10)
    ports = DevicePorts(spike=rx.getsockname()[1])
    recording = tmp_path / "recording"
    device = DeviceProgram(
        ["spikeloop", "device", "--backend", "zero", "--as-fast-as-possible", *ports.device_flags()]
        + ["--recording-path", str(recording)],
        tmp_path / "device.log",
    )
    try:
        kept = _stim(ports, rx)  # the last kept iteration: episode 1 ends in it
        _event(ports, "episode_end", {"episode": 1})
        _recorded_events(recording, 1)
        lost = _stim(ports, rx)  # the iteration the trainer then loses: episode 2 ends in it
        _event(ports, "episode_end", {"episode": 2})
        _recorded_events(recording, 2)
        _event(ports, "discarded", discarded_data("resume", 1, 2, kept, now_us()))
        _recorded_events(recording, 3)
        again = _stim(ports, rx)  # the resumed run: episode 2 once more
        _event(ports, "episode_end", {"episode": 2})
        _recorded_events(recording, 4)
        _event(ports, "training_complete", {"reason": "completed", "total_steps": 2, "total_episodes": 2})
        summary = device.summary(timeout=30)
    finally:
        device.stop()
        rx.close()
    assert summary["event_discarded"] == 1 and "event_other" not in summary, summary
    assert "the trainer discarded work this device recorded" in device.text()

    stims, events = read_recording(recording)
    assert [(s["timestamp_us"], s["discarded"]) for s in stims] == [(kept, False), (lost, True), (again, False)]
    ends = [(e["data"]["episode"], e["discarded"]) for e in events if e["event_type"] == "episode_end"]
    assert ends == [(1, False), (2, True), (2, False)], events
    assert standing_episodes(events) == [1, 2]
    (discard,) = [e for e in events if e["event_type"] == "discarded"]
    assert discard["data"]["episodes_from"] == 2 and not discard["discarded"]
    # The files are plain JSON lines, one event a line, as a lab's own tools read them.
    assert all(json.loads(line) for p in recording.glob("*.jsonl") for line in p.read_text().splitlines())
