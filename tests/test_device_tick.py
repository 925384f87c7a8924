"""`spikeloop device` behaving like a third-party hardware loop (issue 13): ticks, its own clock, its own socket.

The device runs as its own process, as a lab's device program does; the trainer
side is a real `BridgeCore`. Checked: replies quantised to the 10 Hz tick
(100-200 ms after the stimulation), stamped by a 16 ms clock and sent from a
free port; one feedback datagram taken per tick (three sent at once wait up to
two ticks); a stimulation taken while a reply is pending discards that reply.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spikeloop.bridge.device.program import build_parser
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, StimCommand, encode_stim

REPO = Path(__file__).resolve().parents[1]


def start_device(*flags: str) -> subprocess.Popen:
    """`spikeloop device FLAGS...` as its own process (stderr kept for its exit summary)."""
    return subprocess.Popen(
        [sys.executable, "-m", "spikeloop.experiments.cli", "device", *flags],
        cwd=REPO,
        env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"},
        stderr=subprocess.PIPE,
        text=True,
    )


def test_tick_quantised_device_with_its_own_clock_and_socket() -> None:
    stim_port, event_port, feedback_port = free_port(), free_port(), free_port()
    address = DeviceAddress(spike_port=0, stim_port=stim_port, event_port=event_port, feedback_port=feedback_port)
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=0.35))
    proc = start_device(
        "--backend",
        "random",
        "--tick-quantised",
        "--tick-frequency",
        "10",
        "--artifact-wait-ms",
        "50",
        "--collect-window-ms",
        "50",
        "--own-clock",
        "--clock-resolution-ms",
        "16",
        "--reply-from",
        "ephemeral",
        "--stim-port",
        str(stim_port),
        "--event-port",
        str(event_port),
        "--feedback-port",
        str(feedback_port),
        "--spike-port",
        str(bridge.spike_port),
    )
    try:
        deadline = time.monotonic() + 60
        while not bridge.exchange([10.0] * 8, [1.5] * 8).ok:  # the process is up once it answers
            assert proc.poll() is None and time.monotonic() < deadline, "the device never answered"
        replies = [bridge.exchange([10.0] * 8, [1.5] * 8) for _ in range(8)]
        assert all(r.ok for r in replies)
        latencies_ms = [r.latency_s * 1000 for r in replies]
        # One tick of windows plus the wait for the tick that takes the stimulation in: never sooner than the
        # windows, typically 100-200 ms (a starved device process on a loaded machine may be later still).
        assert min(latencies_ms) >= 90 and 95 <= sorted(latencies_ms)[len(latencies_ms) // 2] <= 215, latencies_ms
        assert all(r.reply_timestamp_us % 16_000 == 0 for r in replies)  # its own, coarse clock
        stats = bridge.stats()
        assert stats["correlation"] == "arrival"
        pinned = int(stats["reply_source"].split(" ", 1)[0].rsplit(":", 1)[1])
        assert pinned != stim_port  # answered from a socket of its own, taken by reply_port auto

        # Three feedback datagrams at once: one is taken per tick, the last waits two ticks.
        command = FeedbackCommand(0, FeedbackType.REWARD, (19, 20, 22), 20, 2.0, 2, False, "reward_positive")
        for _ in range(3):
            assert bridge.feedback(command)
        time.sleep(0.5)
        # Two stimulations back to back (not a bridge: it never sends one before the last is answered or written
        # off): the second, taken one tick later, discards the first one's pending reply.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            for ts in (1, 2):
                raw.sendto(encode_stim(StimCommand(ts, (10.0,) * 8, (1.5,) * 8)), ("127.0.0.1", stim_port))
        time.sleep(0.5)
        assert bridge.exchange([10.0] * 8, [1.5] * 8).ok  # the extra reply was drained, not taken
        bridge.event("training_complete", {"reason": "test over"})
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        bridge.close()
    assert proc.returncode == 0
    summary = json.loads(err.strip().splitlines()[-1])["spikeloop_device"]
    assert summary["exit_reason"] == "training_complete"
    assert summary["feedback"] == 3
    assert summary["lag_ticks_max_feedback"] == 2 and summary["backlog_max_feedback"] == 2
    assert summary["replies_discarded"] == 1
    assert summary["replies"] == summary["stim"] - 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tick-quantised", "--as-fast-as-possible"], "use it with --realtime"),
        (["--tick-quantised", "--backend", "cl"], "cl backend already runs on its own ticks"),
        (["--own-clock", "--clock-resolution-ms", "-1"], "clock_resolution_ms"),
    ],
)
def test_device_flags_that_cannot_work_are_refused(flags: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "device", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_help_lists_the_third_party_behaviours() -> None:
    text = build_parser().format_help()
    for flag in ("--tick-quantised", "--own-clock", "--clock-resolution-ms", "--constant-clock", "--reply-from"):
        assert flag in text
