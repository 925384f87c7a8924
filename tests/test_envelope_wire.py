"""Random commands through the bridge under random valid envelopes: nothing outside the envelope on the wire.

Hypothesis draws an envelope (refused at construction if it contradicts itself, as
it must be), then stimulation and feedback commands with NaN, inf, subnormal,
huge and negative values, forbidden and out-of-range channels, huge pulse counts
and unknown types, some of them objects that skipped their constructor (as an
unpickled one can). Each goes through a real `BridgeCore` to a loopback device
that keeps every datagram; every datagram is decoded off the wire and judged by
plain comparisons against the envelope's numbers, not by the envelope's code.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, FORBIDDEN_ELECTRODES, N_ELECTRODES, N_ENCODING
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, ProtocolError, decode_feedback, decode_stim
from spikeloop.bridge.wire.safety import SafetyEnvelope, SafetyViolation

EXAMPLES = 250
TRIED = {"envelopes": 0, "refused_envelopes": 0, "stim": 0, "feedback": 0, "on_wire": 0, "refused": 0, "outside": 0}


@pytest.fixture(scope="module")
def device():
    with LoopbackDevice() as dev:
        yield dev
    print(f"\nenvelope fuzz: {TRIED}")


def envelopes():
    """Envelopes over a wide range of scales; some contradict themselves or pass the hard ceiling (3 uA, 3 nC,
    200 Hz: spikeloop.bridge.wire.safety.CEILINGS), and must then be refused."""
    return st.builds(
        dict,
        min_frequency_hz=st.floats(0.01, 150),
        span_hz=st.floats(1, 60) | st.floats(1, 60) | st.floats(1, 120) | st.floats(0, 1.5),
        min_amplitude_ua=st.floats(0.01, 2.5),
        span_ua=st.floats(0, 1) | st.floats(0.01, 2) | st.floats(0.01, 0.5) | st.just(0.0),
        phase_width_us=st.floats(20, 500),
        charge_factor=st.floats(0.8, 4),  # below 1: the charge cap may fall under the minimum amplitude
        max_pulses=st.integers(0, 1000),
        extra_forbidden=st.sets(st.integers(0, N_ELECTRODES - 1), max_size=12),
    )


def build(draw: dict) -> SafetyEnvelope:
    # Minimums as float32 values, so that an empty span is a one-value range rather than no range at all.
    min_a = float(np.float32(draw["min_amplitude_ua"]))
    min_f = float(np.float32(draw["min_frequency_hz"]))
    return SafetyEnvelope(
        min_frequency_hz=min_f,
        max_frequency_hz=min_f + draw["span_hz"],
        min_amplitude_ua=min_a,
        max_amplitude_ua=min_a + draw["span_ua"],
        phase_width_us=draw["phase_width_us"],
        max_charge_per_phase_nc=(min_a + draw["span_ua"]) * draw["phase_width_us"] / 1000.0 * draw["charge_factor"],
        max_pulses=draw["max_pulses"],
        forbidden_electrodes=FORBIDDEN_ELECTRODES | draw["extra_forbidden"],
    )


def hostile_floats(lo: float, hi: float, wild: bool):
    """Values that test a bound (either side of it, as float32 rounds them) and, when wild, anything at all."""
    edges = [
        lo,
        hi,
        lo * (1 - 1e-7),
        hi * (1 + 1e-7),
        math.nextafter(lo, 0),
        math.nextafter(hi, math.inf),
        (lo + hi) / 2,
        -lo,
        1e-45,
        5e-324,
        -0.0,
        0.0,
        1e300,
        3.4e38,
    ]
    finite = st.sampled_from(edges) | st.floats(lo * 0.5, hi * 2) | st.floats(lo, hi)
    if not wild:
        return finite
    return finite | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([math.nan, math.inf, -math.inf])


def raw_feedback(**fields) -> FeedbackCommand:
    """A FeedbackCommand that skipped its constructor's checks, as unpickling one does."""
    cmd = object.__new__(FeedbackCommand)
    for name, value in fields.items():
        object.__setattr__(cmd, name, value)
    return cmd


def inside(envelope: SafetyEnvelope, freq: float, amp: float) -> bool:
    """Plain comparisons: off (0), or within every bound including the charge per phase."""
    if freq == 0.0 or amp == 0.0:
        return freq == 0.0 and amp == 0.0  # what the envelope sends for "off"
    return (
        envelope.min_frequency_hz <= freq <= envelope.max_frequency_hz
        and envelope.min_amplitude_ua <= amp <= envelope.max_amplitude_ua
        # charge per phase; 1e-12 relative: the product's own rounding, not a physical excess
        and amp * envelope.phase_width_us / 1000.0 <= envelope.max_charge_per_phase_nc * (1 + 1e-12)
    )


def _wait_for(items: list, n: int) -> None:
    deadline = time.monotonic() + 2
    while len(items) < n and time.monotonic() < deadline:
        time.sleep(0.0005)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(draw=envelopes(), policy=st.sampled_from(["clamp", "raise"]), data=st.data())
def test_nothing_outside_a_random_envelope_reaches_the_wire(device, draw, policy, data):
    try:
        envelope = build(draw)
    except ValueError as exc:
        TRIED["refused_envelopes"] += 1
        assert str(exc).split("=")[0].split(" ")[0] in {f.name for f in dataclasses.fields(SafetyEnvelope)}
        return
    TRIED["envelopes"] += 1
    address = DeviceAddress(
        spike_port=0, stim_port=device.stim_port, feedback_port=device.feedback_port, event_port=device.event_port
    )
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=0.5, envelope=envelope, envelope_policy=policy))
    device.spike_port = bridge.spike_port
    first = len(device.received_stims), len(device.received_feedback)  # what this example's bridge sends
    try:
        for _ in range(data.draw(st.integers(10, 30), label="commands")):
            wild = data.draw(st.integers(0, 4), label="wild?") == 0  # one command in five may carry NaN/inf
            freqs_st = hostile_floats(envelope.min_frequency_hz, envelope.max_frequency_hz, wild)
            amps_st = hostile_floats(envelope.min_amplitude_ua, envelope.effective_max_amplitude_ua, wild)
            pulses_st = (
                st.integers(0, envelope.max_pulses + 2)
                | st.integers(-10, 2**40)
                | st.sampled_from([envelope.max_pulses, envelope.max_pulses + 1, 2**32 - 1, 0.5])
            )
            if wild:
                pulses_st |= st.floats(allow_nan=True, allow_infinity=True)
            channel = st.integers(0, N_ELECTRODES - 1) | st.sampled_from(sorted(envelope.forbidden_electrodes))
            channels_st = st.lists(channel | st.integers(-3, 300) if wild else channel, max_size=70 if wild else 6)
            stims_before, fb_before = len(device.received_stims), len(device.received_feedback)
            if data.draw(st.booleans(), label="stim?"):
                TRIED["stim"] += 1
                freqs = data.draw(st.lists(freqs_st, min_size=N_ENCODING, max_size=N_ENCODING), label="freqs")
                amps = data.draw(st.lists(amps_st, min_size=N_ENCODING, max_size=N_ENCODING), label="amps")
                try:
                    assert bridge.exchange(freqs, amps).ok
                except (SafetyViolation, ProtocolError):
                    TRIED["refused"] += 1
                    assert len(device.received_stims) == stims_before, "a refused stimulation was sent"
                continue
            TRIED["feedback"] += 1
            fields = dict(
                timestamp_us=data.draw(st.integers(1, 2**63), label="ts"),
                feedback_type=data.draw(st.sampled_from([0, 1, 2, 3, 255]), label="type"),
                channels=tuple(data.draw(channels_st, label="channels")),
                frequency_hz=data.draw(freqs_st | pulses_st, label="freq"),
                amplitude_ua=data.draw(amps_st, label="amp"),
                pulses=data.draw(pulses_st, label="pulses"),
                unpredictable=data.draw(st.booleans(), label="flag"),
                event_name=data.draw(st.sampled_from(["x", "enemy_kill", "é" * 40, ""]), label="name"),
            )
            try:
                if data.draw(st.booleans(), label="skip constructor?"):
                    sent = bridge.feedback(raw_feedback(**fields))
                else:
                    sent = bridge.feedback(FeedbackCommand(**fields))
            except (SafetyViolation, ProtocolError):
                TRIED["refused"] += 1
                assert len(device.received_feedback) == fb_before, "a refused feedback command was sent"
                continue
            if sent:
                _wait_for(device.received_feedback, fb_before + 1)
    finally:
        bridge.close()
    check_wire(device.received_stims[first[0] :], device.received_feedback[first[1] :], envelope)


def check_wire(stims: list[bytes], feedback: list[bytes], envelope: SafetyEnvelope) -> None:
    """Decode every datagram a bridge sent and check it against its envelope."""
    for data in stims:
        stim = decode_stim(data)  # raises if malformed: the bridge never sends that
        TRIED["on_wire"] += 1
        for i, (f, a) in enumerate(zip(stim.frequencies_hz, stim.amplitudes_ua)):
            forbidden = ENCODING_ELECTRODES[i] in envelope.forbidden_electrodes
            if not inside(envelope, f, a) or (forbidden and (f, a) != (0.0, 0.0)):
                TRIED["outside"] += 1
                pytest.fail(f"stimulation entry {i} on the wire: {f!r} Hz {a!r} uA, envelope {envelope}")
    for data in feedback:
        fb = decode_feedback(data)
        TRIED["on_wire"] += 1
        bad = set(fb.channels) & envelope.forbidden_electrodes
        if bad or not fb.channels:
            TRIED["outside"] += 1
            pytest.fail(f"feedback on the wire addresses {sorted(bad) or 'no channel'}: {fb}")
        if fb.feedback_type == FeedbackType.INTERRUPT:
            assert (fb.frequency_hz, fb.amplitude_ua, fb.pulses) == (0, 0.0, 0)
            continue
        if not (
            inside(envelope, fb.frequency_hz, fb.amplitude_ua)
            and fb.frequency_hz > 0
            and 1 <= fb.pulses <= envelope.max_pulses
        ):
            TRIED["outside"] += 1
            pytest.fail(f"feedback on the wire outside the envelope: {fb}, envelope {envelope}")


SWEEP = 3000
"""Commands per envelope in the seeded sweep below."""
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 5e-324, -1.0, 1e20, 3.4e38, 1e300])


@pytest.mark.parametrize("policy", ["clamp", "raise"])
@pytest.mark.parametrize(
    "envelope",
    [
        SafetyEnvelope(),
        SafetyEnvelope(min_frequency_hz=4.0, max_frequency_hz=40.0, min_amplitude_ua=1.0, max_amplitude_ua=2.5),
        SafetyEnvelope(
            min_frequency_hz=10.3,
            max_frequency_hz=11.7,
            min_amplitude_ua=0.7,
            max_amplitude_ua=2.2,
            max_charge_per_phase_nc=0.25,
            max_pulses=7,
            forbidden_electrodes=FORBIDDEN_ELECTRODES | {9, 19},
        ),
    ],
    ids=["default", "reference", "narrow"],
)
def test_seeded_sweep_of_hostile_commands_stays_inside(device, envelope, policy):
    """Thousands of commands per envelope, values drawn around its bounds and from the special values."""
    rng = np.random.default_rng(14)
    address = DeviceAddress(
        spike_port=0, stim_port=device.stim_port, feedback_port=device.feedback_port, event_port=device.event_port
    )
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=0.5, envelope=envelope, envelope_policy=policy))
    device.spike_port = bridge.spike_port
    first = len(device.received_stims), len(device.received_feedback)

    def values(lo: float, hi: float, n: int) -> np.ndarray:
        v = rng.uniform(lo * 0.5, hi * 1.5, n)
        special = rng.random(n) < 0.02
        v[special] = rng.choice(SPECIALS, special.sum())
        return v

    try:
        for i in range(SWEEP):
            if i % 2:
                TRIED["stim"] += 1
                try:
                    bridge.exchange(
                        values(envelope.min_frequency_hz, envelope.max_frequency_hz, N_ENCODING),
                        values(envelope.min_amplitude_ua, envelope.max_amplitude_ua, N_ENCODING),
                    )
                except (SafetyViolation, ProtocolError):
                    TRIED["refused"] += 1
                continue
            TRIED["feedback"] += 1
            n_fb = len(device.received_feedback)
            channels = tuple(int(c) for c in rng.integers(0, N_ELECTRODES, int(rng.integers(0, 6))))
            pulses = float(rng.choice([rng.integers(0, 2 * envelope.max_pulses + 2), 2**32 - 1, -3, np.nan]))
            try:
                sent = bridge.feedback(
                    FeedbackCommand(
                        0,
                        FeedbackType(int(rng.integers(0, 3))),
                        channels,
                        float(values(envelope.min_frequency_hz, envelope.max_frequency_hz, 1)[0]),
                        float(values(envelope.min_amplitude_ua, envelope.max_amplitude_ua, 1)[0]),
                        pulses,
                    )
                )
            except (SafetyViolation, ProtocolError):
                TRIED["refused"] += 1
                continue
            if sent:
                _wait_for(device.received_feedback, n_fb + 1)
    finally:
        bridge.close()
    check_wire(device.received_stims[first[0] :], device.received_feedback[first[1] :], envelope)


def test_the_fuzz_tried_enough_and_found_nothing_outside():
    """Runs after the property test: how much it tried (printed for the closing figures)."""
    print(f"\nenvelope fuzz totals: {TRIED}")
    assert TRIED["envelopes"] >= EXAMPLES // 3 and TRIED["refused_envelopes"] > 0
    assert TRIED["stim"] + TRIED["feedback"] >= 15_000 and TRIED["on_wire"] >= 5_000 and TRIED["refused"] > 0
    assert TRIED["outside"] == 0
