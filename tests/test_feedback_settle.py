"""The device's feedback_settle_ms keeps feedback-evoked spikes out of the next reply (the direct path cut)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import FEEDBACK_REFERENCE, N_ENCODING
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    decode_spikes,
    encode_feedback,
    encode_stim,
)

TRIALS = 30
SILENT = (tuple([0.0] * N_ENCODING), tuple([0.0] * N_ENCODING))
"""A stimulation that stimulates nothing: its reply is whatever the culture does by itself, or was made to do."""
_CHANNELS, _HZ, _UA, _PULSES, _ = FEEDBACK_REFERENCE["enemy_kill"]
FEEDBACK = FeedbackCommand(0, FeedbackType.EVENT, _CHANNELS, _HZ, _UA, _PULSES, event_name="enemy_kill")
"""The reference enemy_kill burst: 40 pulses at 20 Hz, 2.5 uA, two seconds."""


def mean_reply(settle_ms: float, feedback: bool) -> np.ndarray:
    """Mean reply (8 groups) to a silent stimulation sent right after feedback (or with none); fixed weights."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5.0)
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=rx.getsockname()[1])
    config = DeviceConfig(
        address=address,
        backend="sim",
        seed=3,
        realtime=False,
        culture=SimulatedCultureConfig(plasticity="none"),
        feedback_settle_ms=settle_ms,
    )
    device = Device(config)
    thread = device.start()
    counts = []
    try:
        for ts in range(1, TRIALS + 1):
            if feedback:  # as a trainer sends it: feedback for the last step, then the next stimulation
                rx.sendto(encode_feedback(FEEDBACK), ("127.0.0.1", device.feedback_port))
            rx.sendto(encode_stim(StimCommand(ts, *SILENT)), ("127.0.0.1", device.stim_port))
            reply = decode_spikes(rx.recv(64))
            assert reply.timestamp_us == ts
            counts.append(reply.counts)
    finally:
        device.stop()
        thread.join(5)
        rx.close()
    return np.mean(counts, axis=0)


@pytest.mark.parametrize("settle_ms", [0.0, 100.0])
def test_settle_time_keeps_feedback_evoked_spikes_out_of_the_reply(settle_ms: float) -> None:
    with_feedback, without = mean_reply(settle_ms, feedback=True), mean_reply(settle_ms, feedback=False)
    evoked = with_feedback.sum() - without.sum()
    print(
        f"settle {settle_ms:g} ms: {with_feedback.sum():.1f} spikes a reply after feedback, {without.sum():.1f} without"
    )
    if settle_ms == 0:
        # Applied at once, the burst's pulses land in the collection window: the decoder reads the feedback.
        assert evoked > 50
    else:
        # Held until 100 ms after the burst's last pulse (then the 50 ms artifact wait): the culture is back to
        # what it does by itself (about 8 spikes a reply, over every group).
        assert abs(evoked) < 2.0
