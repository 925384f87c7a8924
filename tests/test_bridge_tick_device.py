"""A device that answers on 10 Hz ticks with its own clock: a loop locked to its ticks survives a change of phase.

The device is `spikeloop device --tick-quantised --own-clock` in its own process (as `bench loop --device tick10`
runs it), over real UDP on loopback. A stimulation is taken on the device's next tick and answered one tick later, so
a reply comes 100-200 ms after it was sent. A loop that sends the next stimulation as soon as a reply lands locks
to the ticks: every reply comes about 200 ms after its stimulation, and the band of reply times the bridge learns
from its answers narrows to a few milliseconds. A pause before one stimulation (an episode's end, a learner update)
moves it to another phase of the ticks, and its reply comes up to a tick sooner than any before. Found on
2026-11-29 (docs/benchmarks.md, "loop"): the bridge refused that reply as sooner than the device ever answers, wrote
off every later one as the earlier stimulation's late reply, and lost the device.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port
from spikeloop.experiments.benchmarks.loop import start_tick_device

LOCKED_EXCHANGES = 70  # more than the clock's samples: its band is learnt from the locked loop alone
PAUSE_S = 0.06  # well inside one 100 ms tick: the next reply comes about 60 ms sooner than the band
AFTER_EXCHANGES = 10


def test_a_reply_sooner_than_the_locked_band_is_taken_and_the_loop_goes_on(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("stim_port", "spike_port", "event_port", "feedback_port")}
    device = start_tick_device(ports, tmp_path / "device.log")
    address = DeviceAddress(
        stim_port=ports["stim_port"],
        spike_port=ports["spike_port"],
        event_port=ports["event_port"],
        feedback_port=ports["feedback_port"],
    )
    bridge = BridgeCore(BridgeConfig(device_id="tick10", address=address))  # the default timeout, 0.5 s
    try:
        for _ in range(LOCKED_EXCHANGES):
            assert bridge.exchange([20.0] * 8, [1.5] * 8).ok, bridge.stats()
        locked = bridge.stats()
        assert locked["reply_clock"]["ready"] and locked["reply_clock"]["band_ms"] < 20, locked
        time.sleep(PAUSE_S)
        replies = [bridge.exchange([20.0] * 8, [1.5] * 8) for _ in range(AFTER_EXCHANGES)]
        stats = bridge.stats()
    finally:
        bridge.close()
        os.killpg(device.pid, signal.SIGTERM)
        device.wait(timeout=30)
    assert all(reply.ok for reply in replies), stats
    # The pause moved the loop to another phase of the ticks: the first reply after it came sooner than any before.
    assert replies[0].latency_s < locked["latency_ms"]["p50"] / 1000 - PAUSE_S / 2, (replies[0], locked)
    assert stats["timeouts"] == 0 and stats["unattributed"] == 0 and stats["late"] == 0, stats
