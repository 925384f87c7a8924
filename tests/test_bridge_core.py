"""Correlation under injected faults, over real UDP on loopback."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from spikeloop.bridge.device.loopback_device import FAULTS, LoopbackDevice
from spikeloop.bridge.trainer.core import AUTO_PLAIN_VOTES, BridgeConfig, BridgeCore, DeviceTimeout
from spikeloop.bridge.trainer.reply_clock import MIN_SAMPLES
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.protocol import SpikeCounts, encode_spikes, now_us

TIMEOUT_S = 0.3  # generous: a loaded CI machine must not turn a good reply into a timeout
LATE_GRACE_S = 0.5  # plain devices: how long the bridge waits for a reply it is still owed


def make_rig(device_reply_port: int | str | None = "stim_port", **device_kwargs) -> tuple[BridgeCore, LoopbackDevice]:
    device = LoopbackDevice(**device_kwargs)
    address = DeviceAddress(
        spike_port=0, stim_port=device.stim_port, feedback_port=device.feedback_port, event_port=device.event_port
    )
    bridge = BridgeCore(
        BridgeConfig(
            address=address,
            timeout_s=TIMEOUT_S,
            late_grace_s=LATE_GRACE_S,
            device_reply_port=device_reply_port,
        )
    )
    device.spike_port = bridge.spike_port
    device.start()
    return bridge, device


def fault_schedule(n: int, seed: int) -> dict[int, str]:
    """10% of exchanges get one of the five faults, in a seeded random order."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(n, size=n // 10, replace=False)
    return {int(i): FAULTS[k % len(FAULTS)] for k, i in enumerate(sorted(picks))}


@pytest.mark.parametrize("echo", [True, False], ids=["echo-device", "plain-v1-device"])
def test_every_ok_reply_answers_its_own_stimulation(echo):
    n = 1000
    faults = fault_schedule(n, seed=7)
    bridge, device = make_rig(echo_timestamps=echo, fault_for=faults.get, delay_s=TIMEOUT_S + 0.05)
    rng = np.random.default_rng(1)
    statuses = []
    slow = 0  # plain device: a delayed reply right after a dropped one is the only reply its probation window saw
    try:
        for _ in range(n):
            freqs = rng.uniform(4, 40, 8).astype(np.float32)
            reply = bridge.exchange(freqs, [1.5] * 8)
            statuses.append(reply.status)
            slow += reply.ok and reply.latency_s > TIMEOUT_S
            if reply.ok:
                # The device encodes the stimulation into the counts.
                np.testing.assert_array_equal(reply.counts, freqs)
            else:
                assert not reply.counts.any()
        time.sleep(TIMEOUT_S + 0.05)  # let the last delayed reply land
        stats = bridge.stats()
    finally:
        device.stop()
        bridge.close()
    injected = device.injected
    assert sum(injected.values()) == len(faults)
    assert stats["correlation"] == ("echo" if echo else "arrival")
    assert stats["exchanges"] == n
    # Echo: a reply read past the timeout (a descheduled bridge thread on a loaded machine) is still its own.
    assert echo or slow < injected["delay"]
    # A plain device's own reply is written off (`unattributed`) rather than taken when it cannot be told from a
    # stalled reply to the stimulation a fault left unanswered: each such costs a timeout.
    lost = injected["drop"] + injected["delay"]
    # A withheld reply may be a lost stimulation's own (late, in its probation window) or any other one.
    withheld = stats["withheld"]
    assert lost <= stats["timeouts"] + slow + withheld <= lost + stats["unattributed"] + withheld
    # Withheld: replies taken by arrival while the clock was learnt after a fault (they only teach the clock).
    assert stats["timeouts"] + stats["withheld"] == statuses.count("timeout") and stats["ambiguous"] == 0
    assert stats["withheld"] <= 3 * MIN_SAMPLES if not echo else stats["withheld"] == 0
    assert stats["ok"] == n - stats["timeouts"] - stats["withheld"]
    # A delayed reply withheld in its own probation window is neither late nor slow.
    assert injected["delay"] - withheld <= stats["late"] + slow <= injected["delay"]
    assert stats["duplicates"] == injected["duplicate"]
    assert stats["malformed"] == injected["corrupt"]
    assert stats["foreign"] == injected["foreign"]
    assert stats["stale"] == 0
    assert stats["latency_ms"]["n"] == stats["ok"]
    lat = stats["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]


def test_reply_port_pinning_counts_other_ports_as_foreign():
    device = LoopbackDevice()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as intruder:
        intruder.bind(("127.0.0.1", 0))
        bridge = BridgeCore(
            BridgeConfig(
                address=DeviceAddress(spike_port=0, stim_port=device.stim_port),
                timeout_s=0.05,
                device_reply_port=intruder.getsockname()[1] + 1,
                correlation="echo",
            )
        )
        device.spike_port = bridge.spike_port
        device.start()
        try:
            reply = bridge.exchange([10.0] * 8, [1.5] * 8)
            assert reply.status == "timeout"
            assert bridge.stats()["foreign"] == 1
        finally:
            device.stop()
            bridge.close()


def test_timeout_policy_raise_names_the_device():
    bridge, device = make_rig(fault_for=lambda i: "drop")
    raising = BridgeCore(
        BridgeConfig(
            device_id="dish-3",
            address=DeviceAddress(spike_port=0, stim_port=device.stim_port),
            timeout_s=0.02,
            timeout_policy="raise",
        )
    )
    try:
        with pytest.raises(DeviceTimeout, match="dish-3.*did not answer within 20 ms"):
            raising.exchange([10.0] * 8, [1.5] * 8)
        assert raising.stats()["timeouts"] == 1
    finally:
        raising.close()
        device.stop()
        bridge.close()


def test_stale_datagram_never_answers_the_next_stimulation():
    """A plain device's leftover reply, waiting before the send, is drained and counted."""
    bridge, device = make_rig(echo_timestamps=False, device_reply_port=None)  # the leftover comes from another port
    try:
        for _ in range(AUTO_PLAIN_VOTES):
            assert bridge.exchange([5.0] * 8, [1.5] * 8).ok
        assert bridge.stats()["correlation"] == "arrival"  # the device is now known to be a plain v1 one
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(encode_spikes(SpikeCounts(1, (77.0,) * 8)), ("127.0.0.1", bridge.spike_port))
        time.sleep(0.01)
        reply = bridge.exchange([6.0] * 8, [1.5] * 8)
        np.testing.assert_array_equal(reply.counts, [6.0] * 8)
        assert bridge.stats()["stale"] == 1
    finally:
        device.stop()
        bridge.close()


def test_spike_port_in_use_is_a_clear_error():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot bind spike port 127.0.0.1:{port}.*another bridge"):
            BridgeCore(BridgeConfig(address=DeviceAddress(spike_port=port)))


def test_spike_port_binds_loopback_by_default():
    with BridgeCore(BridgeConfig(address=DeviceAddress(spike_port=0))) as bridge:
        assert bridge._spike_sock.getsockname()[0] == "127.0.0.1"


def test_feedback_and_events_reach_the_device():
    from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, decode_event, decode_feedback

    bridge, device = make_rig()
    try:
        assert bridge.feedback(FeedbackCommand(0, FeedbackType.REWARD, (19, 20, 22), 20, 2.0, 30, False, "reward"))
        bridge.event("episode_end", {"episode": 1, "episode_reward": 3.5})
        deadline = time.monotonic() + 2
        while (not device.received_feedback or not device.received_events) and time.monotonic() < deadline:
            time.sleep(0.005)
        fb = decode_feedback(device.received_feedback[0])
        assert fb.channels == (19, 20, 22) and fb.timestamp_us > 0
        ev = decode_event(device.received_events[0])
        assert ev.event_type == "episode_end" and ev.data["episode"] == 1
        stats = bridge.stats()
        assert stats["feedback_sent"] == 1 and stats["events_sent"] == 1
    finally:
        device.stop()
        bridge.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_policy": "retry"}, "timeout_policy"),
        ({"correlation": "seq"}, "correlation"),
        ({"address": DeviceAddress(stim_port=0)}, "stim_port=0"),
        ({"address": ("127.0.0.1", 12345)}, "DeviceAddress"),
    ],
)
def test_bad_bridge_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BridgeConfig(**kwargs)


def test_closed_bridge_refuses_work():
    bridge = BridgeCore(BridgeConfig(address=DeviceAddress(spike_port=0)))
    bridge.close()
    bridge.close()
    with pytest.raises(RuntimeError, match="closed"):
        bridge.exchange([10.0] * 8, [1.5] * 8)


@pytest.mark.parametrize("echo", [True, False], ids=["echo-device", "plain-v1-device"])
def test_a_stale_reply_first_does_not_decide_the_correlation(echo):
    """After a trainer restart a real-time device may still owe an old reply: it must not answer, nor decide.

    An echo device's stale reply is refused for good (its stamp names no stimulation awaited). A plain device's
    stamps decide nothing once it is known to be plain, so its stale replies are refused only while undecided,
    which is when a restart leaves them (later, a second reply after one send is counted when it shows up).
    """
    stale_at = {0, 1, 2, 7} if echo else {0, 1, 2}
    bridge, device = make_rig(echo_timestamps=echo, fault_for=lambda i: "stale" if i in stale_at else None)
    try:
        for i in range(20):
            freqs = np.full(8, 5.0 + i, dtype=np.float32)
            reply = bridge.exchange(freqs, [1.5] * 8)
            assert reply.ok
            np.testing.assert_array_equal(reply.counts, freqs)  # never the stale datagram's 55s
        stats = bridge.stats()
    finally:
        device.stop()
        bridge.close()
    assert device.injected["stale"] == len(stale_at)
    assert stats["correlation"] == ("echo" if echo else "arrival")
    assert stats["stale"] == len(stale_at) and stats["ok"] == 20


def test_replies_from_another_port_of_the_device_host_are_refused_with_reply_port_stim_port():
    """A same-host process cannot answer for the device when only its stimulation port may."""
    device = LoopbackDevice(fault_for=lambda i: "drop")  # the device itself never answers
    bridge = BridgeCore(
        BridgeConfig(
            address=DeviceAddress(spike_port=0, stim_port=device.stim_port),
            timeout_s=0.1,
            device_reply_port="stim_port",
        )
    )
    device.spike_port = bridge.spike_port
    device.start()
    forged = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as forger:
        forger.bind(("127.0.0.1", 0))
        stop = threading.Event()

        def forge():  # floods the spike port with replies carrying every plausible timestamp
            while not stop.is_set():
                ts = now_us()
                for guess in range(ts - 2000, ts + 2000, 50):
                    forger.sendto(encode_spikes(SpikeCounts(guess, (99.0,) * 8)), ("127.0.0.1", bridge.spike_port))
                forged.append(1)
                time.sleep(0.001)

        thread = threading.Thread(target=forge, daemon=True)
        thread.start()
        try:
            replies = [bridge.exchange([10.0] * 8, [1.5] * 8) for _ in range(10)]
        finally:
            stop.set()
            thread.join()
            stats = bridge.stats()
            device.stop()
            bridge.close()
    assert all(r.status == "timeout" for r in replies)
    assert stats["ok"] == 0 and stats["foreign"] > 0 and forged
    assert stats["last_foreign_source"].startswith("127.0.0.1:")


@pytest.mark.parametrize("status_requests", [True, False])
def test_episode_end_asks_for_the_device_status_unless_switched_off(status_requests):
    from spikeloop.bridge.wire.protocol import decode_event

    device = LoopbackDevice().start()
    address = DeviceAddress(
        spike_port=0, stim_port=device.stim_port, feedback_port=device.feedback_port, event_port=device.event_port
    )
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=TIMEOUT_S, status_requests=status_requests))
    device.spike_port = bridge.spike_port
    try:
        assert bridge.exchange([10.0] * 8, [1.5] * 8).ok
        bridge.event("episode_end", {"episode": 1})
        assert bridge.device_status(wait_s=0.2) is None  # the loopback device does not answer; off: not asked
        deadline = time.monotonic() + 2
        expected = ["episode_end", "status_request", "status_request"] if status_requests else ["episode_end"]
        while len(device.received_events) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # anything more would have arrived by now
        assert [decode_event(e).event_type for e in device.received_events] == expected
        assert bridge.stats()["status_requests"] == len(expected) - 1
    finally:
        device.stop()
        bridge.close()
