"""The trainer's bridge (`spikeloop.bridge.trainer.core.BridgeCore`) against the device program, every backend.

1,000 exchanges per backend, as fast as possible, interleaved with feedback,
events and fuzzed datagrams on every device port: zero misaligned replies, zero
timeouts, every junk datagram counted, the device still serving at the end.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import FEEDBACK_REFERENCE, N_ENCODING
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType

EXCHANGES = 1000


def feedback(name: str) -> FeedbackCommand:
    channels, freq, amp, pulses, unpredictable = FEEDBACK_REFERENCE[name]
    return FeedbackCommand(0, FeedbackType.REWARD, channels, min(freq, 40), amp, pulses, unpredictable, name)


@pytest.mark.parametrize(
    ("backend", "windows_ms"),
    [("sim", (1.0, 1.0)), ("random", (0.0, 0.0)), ("zero", (0.0, 0.0))],
)
def test_bridge_runs_1000_aligned_exchanges_through_fuzz(backend: str, windows_ms: tuple[float, float]) -> None:
    device = Device(
        DeviceConfig(
            address=DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=0),
            backend=backend,
            seed=11,
            realtime=False,
            artifact_wait_ms=windows_ms[0],
            collect_window_ms=windows_ms[1],
            random_spike_rate_hz=100.0,
        )
    )
    address = DeviceAddress(
        spike_port=0, stim_port=device.stim_port, feedback_port=device.feedback_port, event_port=device.event_port
    )
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=1.0, correlation="echo"))
    device.spike_port = bridge.spike_port
    thread = device.start()
    rng = np.random.default_rng(0)
    fuzz = bridge._send_sock  # the bridge's own sending socket: junk arrives from the trainer's address
    ports = (device.stim_port, device.feedback_port, device.event_port)
    junk_sent = misaligned = 0
    try:
        for i in range(EXCHANGES):
            reply = bridge.exchange(rng.uniform(4, 40, N_ENCODING), rng.uniform(1.0, 2.5, N_ENCODING))
            if not reply.ok or reply.reply_timestamp_us != reply.stim_timestamp_us:
                misaligned += 1
            if i % 10 == 0:
                bridge.feedback(feedback("step_reward_positive" if i % 20 else "enemy_kill"))
            if i % 100 == 99:
                bridge.event("episode_end", {"episode": i // 100, "episode_reward": float(i)})
            if i % 5 == 0:
                junk = rng.bytes(int(rng.integers(0, 130)))
                if len(junk) in (72, 120):  # exact sizes could decode as a valid command by chance
                    junk += b"\x00"
                fuzz.sendto(junk, ("127.0.0.1", ports[i % 3]))
                junk_sent += 1
        time.sleep(0.1)
        stats = bridge.stats()
        assert misaligned == 0
        assert stats["ok"] == EXCHANGES and stats["timeouts"] == 0
        assert stats["late"] == stats["stale"] == stats["duplicates"] == 0
        assert thread.is_alive()
        malformed = sum(v for k, v in device.counters.items() if k.startswith("malformed_"))
        assert malformed == junk_sent
        assert device.counters["stim"] == device.counters["replies"] == EXCHANGES
        assert device.counters["feedback"] == EXCHANGES // 10
        assert device.counters["event_episode_end"] == EXCHANGES // 100
    finally:
        bridge.event("training_complete", {"reason": "test over"})
        thread.join(5)
        bridge.close()
    assert device.exit_reason == "training_complete"
