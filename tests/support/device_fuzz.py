"""Hostile datagrams against a running device program, for every backend (cl included, under cl-sdk).

`fuzz_device` sends thousands of malformed and hostile datagrams to each of a
device's three ports over real loopback UDP, interleaved with valid
stimulations, and reports what happened. It watches the backend's own
stimulate/feedback calls (the device's last word before the culture) so that a
caller can check that nothing outside the device's envelope got through.

Only the standard library, numpy and the device's own modules are used: the
cl-sdk suite (Python 3.12, no Ray, no hypothesis) runs it too.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spikeloop.bridge.device.program import Device
from spikeloop.bridge.wire.channels import N_ENCODING, POSITIVE_FEEDBACK_ELECTRODES
from spikeloop.bridge.wire.protocol import (
    EVENT_HEADER_STRUCT,
    FEEDBACK_SIZE,
    FEEDBACK_STRUCT,
    STIM_SIZE,
    STIM_STRUCT,
    EventMessage,
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    decode_spikes,
    encode_event,
    encode_feedback,
    encode_stim,
)
from spikeloop.bridge.wire.safety import SafetyEnvelope

FOREIGN_HOST = "127.0.0.2"
"""Another loopback address: a sender on this machine that is not the training host."""
BATCH = 20
"""Hostile datagrams between two valid stimulations (small enough never to fill a receive buffer)."""
REPLY_WAIT_S = 5.0

F32_MAX = 3.4028234663852886e38
SPECIAL = (math.nan, math.inf, -math.inf, 1e20, F32_MAX, -1.0, -1e-45, 1e-45, 1e6, -F32_MAX)
"""Values put into one field of an otherwise valid command."""


def _f32_field(value: float) -> bytes:
    return struct.pack("<f", value)


def _stim_bytes(ts: int, freqs, amps) -> bytes:
    # Packed by hand: the codec's own encoder refuses the non-finite values on purpose.
    return STIM_STRUCT.pack(ts, *freqs, *amps)


def _feedback_bytes(
    ts: int,
    ftype: int,
    channels,
    freq: int,
    amp: float,
    pulses: int,
    flag: int = 0,
    name: bytes = b"fuzz",
    n: int | None = None,
) -> bytes:
    slots = list(channels) + [0xFF] * (64 - len(channels))
    return FEEDBACK_STRUCT.pack(ts, ftype, len(channels) if n is None else n, *slots, freq, amp, pulses, flag, name)


def _event_bytes(body: bytes, header_length: int | None = None, ts: int = 1) -> bytes:
    return EVENT_HEADER_STRUCT.pack(ts, len(body) if header_length is None else header_length) + body


def _f32_next(value: float, direction: float) -> float:
    """The float32 next to `value` (itself rounded to float32) towards `direction`."""
    return float(np.nextafter(np.float32(value), np.float32(direction)))


def edge_values(envelope: SafetyEnvelope) -> tuple[list[float], list[float]]:
    """(frequencies, amplitudes) just outside the envelope's bounds, as the wire's float32 carries them."""
    hi_a = min(envelope.max_amplitude_ua, envelope.max_charge_per_phase_nc * 1000.0 / envelope.phase_width_us)
    freqs = [
        _f32_next(envelope.min_frequency_hz, -1.0)
        if np.float32(envelope.min_frequency_hz) >= envelope.min_frequency_hz
        else float(np.float32(envelope.min_frequency_hz)),
        _f32_next(envelope.max_frequency_hz, math.inf),
        envelope.max_frequency_hz * 1.25,
    ]
    amps = [_f32_next(envelope.min_amplitude_ua, -1.0), _f32_next(hi_a, math.inf), hi_a * 1.1]
    return [f for f in freqs if not envelope.min_frequency_hz <= f <= envelope.max_frequency_hz], [
        a for a in amps if not envelope.min_amplitude_ua <= a <= hi_a
    ]


def hostile_stims(rng: np.random.Generator, n: int, envelope: SafetyEnvelope) -> list[bytes]:
    """Malformed or out-of-envelope stimulation datagrams (a few random ones may decode inside it)."""
    edge_f, edge_a = edge_values(envelope)
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:  # wrong size
            size = int(rng.integers(0, 300))
            out.append(rng.bytes(size if size != STIM_SIZE else size + 1))
        elif kind == 1:  # the right size, random content (NaN/inf/huge floats, anything)
            out.append(rng.bytes(STIM_SIZE))
        else:  # one special or just-outside value in one field of an otherwise ordinary command
            freqs = [20.0] * N_ENCODING
            amps = [1.5] * N_ENCODING
            slot = int(rng.integers(0, 2 * N_ENCODING))
            choices = SPECIAL if kind < 4 else (edge_f if slot < N_ENCODING else edge_a)
            (freqs if slot < N_ENCODING else amps)[slot % N_ENCODING] = choices[int(rng.integers(0, len(choices)))]
            out.append(_stim_bytes(int(rng.integers(0, 2**64, dtype=np.uint64)), freqs, amps))
    return out


def hostile_feedback(rng: np.random.Generator, n: int, envelope: SafetyEnvelope) -> list[bytes]:
    """Malformed or out-of-envelope feedback datagrams."""
    edge_f, edge_a = edge_values(envelope)
    low_hz = math.ceil(envelope.min_frequency_hz) - 1
    crafted = [
        lambda: _feedback_bytes(1, 2, (19, 20, 22), math.floor(envelope.max_frequency_hz) + 1, 2.0, 30),
        lambda: _feedback_bytes(1, 2, (19, 20, 22), int(edge_f[-1]), 2.0, 30),
        lambda: _feedback_bytes(1, 2, (19, 20, 22), low_hz if low_hz > 0 else 1, 2.0 if low_hz > 0 else -2.0, 30),
        lambda: _feedback_bytes(1, 2, (19, 20, 22), 20, edge_a[int(rng.integers(0, len(edge_a)))], 30),
        lambda: _feedback_bytes(1, 1, (35, 36, 38), 20, 2.0, envelope.max_pulses + 1),
        lambda: _feedback_bytes(1, 2, (19, 20, 22), 20, 3e38, 30),  # 3e38 uA
        lambda: _feedback_bytes(1, 2, (19, 20, 22), 20, 2.0, 2**32 - 1),  # 4.29e9 pulses
        lambda: _feedback_bytes(1, 2, (19, 20, 22), 2**32 - 1, 2.0, 30),  # 4.29e9 Hz
        lambda: _feedback_bytes(1, 2, (19, 20, 22), 0, 2.0, 30),  # 0 Hz with pulses: no 1 kHz burst
        lambda: _feedback_bytes(1, 1, (35, 36), 20, -2.0, 30),  # negative amplitude
        lambda: _feedback_bytes(1, 2, (19,), 20, math.nan, 30),  # NaN amplitude
        lambda: _feedback_bytes(1, 2, (19,), 20, math.inf, 30),  # inf amplitude
        lambda: _feedback_bytes(1, 2, (19,), 20, 1e-45, 30),  # subnormal amplitude
        lambda: _feedback_bytes(1, 2, (0, 19), 20, 2.0, 30),  # forbidden electrode
        lambda: _feedback_bytes(1, 0, (0, 4, 63), 0, 0.0, 0),  # interrupt on forbidden ones only
        lambda: _feedback_bytes(1, 2, (19,), 20, 2.0, 30, n=65),  # more channels than slots
        lambda: _feedback_bytes(1, 2, (19,), 20, 2.0, 30, n=10),  # unused slots (0xFF) named
        lambda: _feedback_bytes(1, 2, (64,), 20, 2.0, 30),  # no such electrode
        lambda: _feedback_bytes(1, 7, (19,), 20, 2.0, 30),  # unknown type
        lambda: _feedback_bytes(1, 2, (19,), 20, 2.0, 30, flag=2),  # flag not 0/1
        lambda: _feedback_bytes(1, 2, (19,), 20, 2.0, 30, name=b"\xff\xfe" * 16),  # name not UTF-8
    ]
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            size = int(rng.integers(0, 400))
            out.append(rng.bytes(size if size != FEEDBACK_SIZE else size + 1))
        elif kind == 1:
            out.append(rng.bytes(FEEDBACK_SIZE))
        else:
            out.append(crafted[int(rng.integers(0, len(crafted)))]())
    return out


def hostile_events(rng: np.random.Generator, n: int) -> list[bytes]:
    """Malformed events, unknown event types (each new, to test bounded counters), oversize ones."""
    deep = b'{"event_type":"episode_end","data":{"x":' + b"[" * 1990 + b"]" * 1990 + b"}}"
    crafted = [
        lambda: _event_bytes(deep),  # 2000 levels deep
        lambda: _event_bytes(b'{"event_type":"episode_end","data":{"r":1e400}}'),  # inf in disguise
        lambda: _event_bytes(b'{"event_type":"episode_end","data":{"r":NaN}}'),
        lambda: _event_bytes(b'{"event_type":"episode_end","data":{"r":-Infinity}}'),
        lambda: _event_bytes(b'{"event_type":"episode_end"}', header_length=2**32 - 1),
        lambda: _event_bytes(b"\xff" * 100),  # not UTF-8
        lambda: _event_bytes(b"x" * 5000),  # over what a device reads
        lambda: _event_bytes(b'{"event_type":3}'),
        lambda: _event_bytes(b'{"event_type":"episode_end","data":[1,2]}'),
        lambda: _event_bytes(b"[]"),
        lambda: _event_bytes(b"{" * 4000),
    ]
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(rng.bytes(int(rng.integers(0, 5000))))
        elif kind == 1:  # a valid event of a type no device knows: accepted, counted as "other"
            out.append(
                encode_event(
                    EventMessage(
                        int(rng.integers(1, 2**40)),
                        f"invented-{i}-{int(rng.integers(1_000_000_000))}",
                        {"v": float(rng.normal())},
                    )
                )
            )
        else:
            out.append(crafted[int(rng.integers(0, len(crafted)))]())
    return out


@dataclass
class FuzzReport:
    """What one fuzz run sent and saw."""

    sent: dict[str, int] = field(default_factory=dict)
    """Hostile datagrams per port (stim, feedback, event), from the training host."""
    foreign_sent: dict[str, int] = field(default_factory=dict)
    valid_stims: int = 0
    answered: int = 0
    wrong_source: int = 0
    other_replies: int = 0
    """Replies to hostile stimulations that decoded (refused or not, each is answered)."""
    stim_calls: list[tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=list)
    feedback_calls: list[FeedbackCommand] = field(default_factory=list)
    seconds: float = 0.0


def _spy(device: Device, report: FuzzReport) -> None:
    """Record every stimulate/feedback call the device makes into its backend, then pass it on."""
    backend = device.backend
    stimulate, feedback = backend.stimulate, backend.feedback

    def spy_stimulate(at_s, frequencies_hz, amplitudes_ua):
        report.stim_calls.append((tuple(frequencies_hz), tuple(amplitudes_ua)))
        return stimulate(at_s, frequencies_hz, amplitudes_ua)

    def spy_feedback(at_s, command):
        report.feedback_calls.append(command)
        return feedback(at_s, command)

    backend.stimulate, backend.feedback = spy_stimulate, spy_feedback


def fuzz_device(
    device: Device,
    rx: socket.socket,
    per_port: int,
    seed: int,
    check_counts=None,
    envelope: SafetyEnvelope | None = None,
) -> FuzzReport:
    """Send `per_port` hostile datagrams to each port (plus foreign ones), a valid stimulation after every batch.

    `device` must be started with its spike port on `rx`. `check_counts(freqs, amps, counts)` may check a
    valid stimulation's reply. Values just outside `envelope` (default: the device's) are among those sent.
    Returns the report; the device is left running.
    """
    rng = np.random.default_rng(seed)
    report = FuzzReport()
    _spy(device, report)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    foreign = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    foreign.bind((FOREIGN_HOST, 0))
    ports = {"stim": device.stim_port, "feedback": device.feedback_port, "event": device.event_port}
    envelope = envelope or device.config.envelope
    hostile = {
        "stim": hostile_stims(rng, per_port, envelope),
        "feedback": hostile_feedback(rng, per_port, envelope),
        "event": hostile_events(rng, per_port),
    }
    # From another host: commands that would be accepted from the training host, and the one that stops it.
    foreign_datagrams = {
        "stim": encode_stim(StimCommand(7, (20.0,) * N_ENCODING, (1.5,) * N_ENCODING)),
        "feedback": encode_feedback(FeedbackCommand(7, FeedbackType.REWARD, POSITIVE_FEEDBACK_ELECTRODES, 20, 2.0, 30)),
        "event": encode_event(EventMessage(7, "training_complete", {"reason": "forged"})),
    }
    report.sent = dict.fromkeys(ports, 0)
    report.foreign_sent = dict.fromkeys(ports, 0)
    device_addr = ("127.0.0.1", device.stim_port)
    ts = 1_000_000
    t0 = time.monotonic()
    try:
        for start in range(0, per_port, BATCH):
            for kind, port in ports.items():
                for datagram in hostile[kind][start : start + BATCH]:
                    tx.sendto(datagram, ("127.0.0.1", port))
                    report.sent[kind] += 1
                if start // BATCH % 10 == 0:
                    foreign.sendto(foreign_datagrams[kind], ("127.0.0.1", port))
                    report.foreign_sent[kind] += 1
            ts += 1
            freqs = tuple(float(f) for f in rng.uniform(4.0, 40.0, N_ENCODING))
            amps = tuple(float(a) for a in rng.uniform(1.0, 2.5, N_ENCODING))
            tx.sendto(encode_stim(StimCommand(ts, freqs, amps)), device_addr)
            report.valid_stims += 1
            _await_reply(
                rx,
                ts,
                device_addr,
                report,
                lambda counts, f=freqs, a=amps: check_counts(f, a, counts) if check_counts else None,
            )
    finally:
        tx.close()
        foreign.close()
    report.seconds = time.monotonic() - t0
    return report


def _await_reply(rx: socket.socket, ts: int, device_addr, report: FuzzReport, check) -> None:
    deadline = time.monotonic() + REPLY_WAIT_S
    while (remaining := deadline - time.monotonic()) > 0:
        rx.settimeout(remaining)
        try:
            data, source = rx.recvfrom(4096)
        except TimeoutError:
            break
        reply = decode_spikes(data)
        if source != device_addr:
            report.wrong_source += 1
        if reply.timestamp_us != ts:
            report.other_replies += 1  # answers a hostile stimulation that decoded; FIFO, so it came first
            continue
        report.answered += 1
        check(reply.counts)
        return


def settle(device: Device, report: FuzzReport, timeout_s: float = 5.0) -> dict[str, int]:
    """Wait until the device has taken in every datagram sent; return its counters."""
    expected = sum(report.sent.values()) + sum(report.foreign_sent.values()) + report.valid_stims
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counters = device.counters
        if taken_in(counters) >= expected and counters["replies"] >= counters["stim"]:
            break  # replies are counted just after they are sent
        time.sleep(0.01)
    return dict(device.counters)


def taken_in(counters) -> int:
    """Datagrams the device has accounted for: decoded, malformed or foreign, on every port."""
    return sum(counters.get(k, 0) for k in ("stim", "feedback", "event")) + sum(
        v for k, v in counters.items() if k.startswith(("malformed_", "foreign_"))
    )


def outside_envelope(report: FuzzReport, envelope: SafetyEnvelope) -> list[str]:
    """Backend calls outside the envelope, judged by plain comparisons (not the envelope's own code)."""
    bad = []
    lo_f, hi_f = envelope.min_frequency_hz, envelope.max_frequency_hz
    lo_a = envelope.min_amplitude_ua
    hi_a = min(envelope.max_amplitude_ua, envelope.max_charge_per_phase_nc * 1000.0 / envelope.phase_width_us)
    for freqs, amps in report.stim_calls:
        for f, a in zip(freqs, amps):
            if f == 0.0 or a == 0.0:
                continue  # off
            if not (lo_f <= f <= hi_f and lo_a <= a <= hi_a):
                bad.append(f"stimulate {f!r} Hz {a!r} uA")
    for cmd in report.feedback_calls:
        if set(cmd.channels) & envelope.forbidden_electrodes:
            bad.append(f"feedback on forbidden {sorted(set(cmd.channels) & envelope.forbidden_electrodes)}")
        if cmd.feedback_type == FeedbackType.INTERRUPT:
            continue
        if not (
            lo_f <= cmd.frequency_hz <= hi_f
            and lo_a <= cmd.amplitude_ua <= hi_a
            and 1 <= cmd.pulses <= envelope.max_pulses
        ):
            bad.append(f"feedback {cmd.frequency_hz!r} Hz {cmd.amplitude_ua!r} uA {cmd.pulses!r} pulses")
    return bad


def recording_is_valid_json(paths: list[Path]) -> int:
    """Parse every line of a JSONL recording strictly (no NaN/Infinity); returns the lines read."""

    def refuse(name):
        raise ValueError(f"non-JSON constant {name}")

    lines = 0
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            json.loads(line, parse_constant=refuse)
            lines += 1
    return lines
