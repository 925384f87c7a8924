"""The safety envelope: whatever a caller passes, nothing outside it leaves the bridge."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, FORBIDDEN_ELECTRODES
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    ProtocolError,
    StimCommand,
    decode_feedback,
    decode_stim,
)
from spikeloop.bridge.wire.safety import SafetyEnvelope, SafetyViolation

ENVELOPE = SafetyEnvelope(
    min_frequency_hz=2.0,
    max_frequency_hz=90.0,
    min_amplitude_ua=0.7,
    max_amplitude_ua=2.2,  # not a float32 value: rounding must not push past it
    max_pulses=60,
    max_charge_per_phase_nc=0.3,  # 2.5 uA at 120 us, looser than the amplitude bound
    forbidden_electrodes=FORBIDDEN_ELECTRODES | {ENCODING_ELECTRODES[3], 20},
)

any_float = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-1e30, 1e30, -0.0, 0.0, 1e-45, 2.2, 90.0])


def assert_inside(envelope: SafetyEnvelope, freq: float, amp: float) -> None:
    if freq == 0.0 or amp == 0.0:
        return  # "off"
    assert envelope.min_frequency_hz <= freq <= envelope.max_frequency_hz
    assert envelope.min_amplitude_ua <= amp <= envelope.effective_max_amplitude_ua
    assert amp * envelope.phase_width_us / 1000.0 <= envelope.max_charge_per_phase_nc + 1e-12


@pytest.fixture(scope="module", params=["clamp", "raise"])
def rig(request):
    device = LoopbackDevice()
    address = DeviceAddress(
        spike_port=0, stim_port=device.stim_port, feedback_port=device.feedback_port, event_port=device.event_port
    )
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=0.5, envelope=ENVELOPE, envelope_policy=request.param))
    device.spike_port = bridge.spike_port
    device.start()
    yield bridge, device, request.param
    device.stop()
    bridge.close()


def _wait_for(items: list, n: int) -> None:
    deadline = time.monotonic() + 2
    while len(items) < n and time.monotonic() < deadline:
        time.sleep(0.001)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(any_float, min_size=8, max_size=8), st.lists(any_float, min_size=8, max_size=8))
def test_no_stim_outside_envelope_leaves_the_bridge(rig, freqs, amps):
    bridge, device, policy = rig
    before = len(device.received_stims)
    non_finite = not all(math.isfinite(v) for v in freqs + amps)
    try:
        reply = bridge.exchange(freqs, amps)
    except (SafetyViolation, ProtocolError):
        assert non_finite or policy == "raise"
        assert len(device.received_stims) == before, "a rejected command was sent"
        return
    assert not non_finite, "NaN/inf must always be rejected"
    assert reply.ok
    sent = decode_stim(device.received_stims[-1])
    for i, (f, a) in enumerate(zip(sent.frequencies_hz, sent.amplitudes_ua)):
        assert_inside(ENVELOPE, f, a)
        if ENCODING_ELECTRODES[i] in ENVELOPE.forbidden_electrodes:
            assert f == 0.0 and a == 0.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(list(FeedbackType)),
    st.lists(st.integers(0, 63), max_size=10),
    any_float,
    any_float,
    any_float,
)
def test_no_feedback_outside_envelope_leaves_the_bridge(rig, ftype, channels, freq, amp, pulses):
    bridge, device, policy = rig
    before = len(device.received_feedback)
    try:
        cmd = FeedbackCommand(0, ftype, tuple(channels), freq, amp, pulses, True, "prop")
        sent_ok = bridge.feedback(cmd)
    except (SafetyViolation, ProtocolError):
        assert len(device.received_feedback) == before, "a rejected command was sent"
        return
    assert all(math.isfinite(v) for v in (freq, amp, pulses)), "NaN/inf must always be rejected"
    if not sent_ok:
        return  # nothing left to send (every channel forbidden)
    _wait_for(device.received_feedback, before + 1)
    sent = decode_feedback(device.received_feedback[-1])
    assert not set(sent.channels) & ENVELOPE.forbidden_electrodes
    assert sent.pulses <= ENVELOPE.max_pulses
    if sent.feedback_type == FeedbackType.INTERRUPT:
        assert (sent.frequency_hz, sent.amplitude_ua, sent.pulses) == (0, 0.0, 0)
    else:
        assert_inside(ENVELOPE, sent.frequency_hz, sent.amplitude_ua)


def test_clamped_commands_are_counted():
    envelope = SafetyEnvelope()
    cmd = FeedbackCommand(1, FeedbackType.REWARD, (0, 19), 500, 9.0, 1000)
    fixed, n = envelope.check_feedback(cmd, "clamp")
    assert fixed.channels == (19,) and fixed.frequency_hz == 200 and fixed.pulses == 200
    assert fixed.amplitude_ua == 3.0 and n == 4
    with pytest.raises(SafetyViolation, match="forbidden electrodes \\[0\\]"):
        envelope.check_feedback(cmd, "raise")


def test_feedback_to_forbidden_channels_only_is_not_sent():
    fixed, n = SafetyEnvelope().check_feedback(FeedbackCommand(1, FeedbackType.REWARD, (0, 4), 20, 2.0, 10), "clamp")
    assert fixed is None and n == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"forbidden_electrodes": frozenset({0})}, "must include"),
        ({"min_amplitude_ua": 3.0, "max_amplitude_ua": 1.0}, "min_amplitude_ua"),
        ({"max_frequency_hz": math.nan}, "max_frequency_hz"),
        ({"max_pulses": -1}, "max_pulses"),
        # Contradictions that used to be accepted and then violated on the wire (issue 14):
        ({"max_charge_per_phase_nc": 0.03, "min_amplitude_ua": 0.5}, "allows at most 0.25 uA.*below min_amplitude_ua"),
        ({"min_frequency_hz": 10.3, "max_frequency_hz": 10.7}, "whole Hz"),
        ({"min_frequency_hz": 0.0}, "min_frequency_hz=0.0: must be a finite number > 0"),
        ({"max_pulses": math.nan}, "max_pulses=nan"),
        ({"max_pulses": 1.5}, "max_pulses=1.5"),
        ({"max_pulses": True}, "max_pulses=True"),
        ({"max_frequency_hz": math.inf}, "max_frequency_hz"),
        ({"phase_width_us": 0.0}, "phase_width_us"),
        ({"min_amplitude_ua": -0.5}, "min_amplitude_ua"),
        ({"min_amplitude_ua": 2.2, "max_amplitude_ua": 2.2}, "no 32-bit float"),
    ],
)
def test_bad_envelope_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SafetyEnvelope(**kwargs)


@pytest.mark.parametrize("policy", ["clamp", "raise"])
def test_bursts_that_stimulate_nothing_are_not_sent(policy):
    """0 Hz, 0 uA or 0 pulses is "off": never a burst at some default rate, never sent."""
    envelope = SafetyEnvelope()
    for freq, amp, pulses in ((0, 2.0, 30), (20, 0.0, 30), (20, 2.0, 0)):
        fixed, n = envelope.check_feedback(FeedbackCommand(1, FeedbackType.REWARD, (19,), freq, amp, pulses), policy)
        assert fixed is None and n == 0


def test_negative_values_are_off_or_refused_never_mirrored():
    envelope = SafetyEnvelope()
    stim = StimCommand(1, (20.0, -20.0) + (0.0,) * 6, (-1.5, 1.5) + (0.0,) * 6)
    fixed, n = envelope.check_stim(stim, "clamp")
    assert fixed.frequencies_hz[:2] == (0.0, 0.0) and fixed.amplitudes_ua[:2] == (0.0, 0.0) and n == 2
    with pytest.raises(SafetyViolation, match="negative"):
        envelope.check_stim(stim, "raise")
    fixed, n = envelope.check_feedback(FeedbackCommand(1, FeedbackType.REWARD, (19,), 20, -2.0, 30), "clamp")
    assert fixed is None and n == 1


def test_feedback_frequency_rounds_to_a_whole_hz_inside_the_range():
    envelope = SafetyEnvelope(min_frequency_hz=10.3, max_frequency_hz=11.7)
    for requested in (10.31, 11.6, 500.0, 1.0):
        fixed, _ = envelope.check_feedback(FeedbackCommand(1, FeedbackType.REWARD, (19,), requested, 2.0, 5), "clamp")
        assert fixed.frequency_hz == 11
