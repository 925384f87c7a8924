"""The `cl` backend against the cl-sdk simulator: a 200-tick closed loop, recording, clean stop."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np

from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.protocol import (
    EventMessage,
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    encode_event,
    encode_feedback,
    encode_stim,
)
from tests.support.device_reply import recv_reply


def test_cl_backend_closed_loop_records_and_stops(tmp_path: Path) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5.0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=rx.getsockname()[1])
    device = Device(
        DeviceConfig(
            address=address,
            backend="cl",
            tick_frequency_hz=100.0,
            artifact_wait_ms=5.0,
            collect_window_ms=5.0,
            recording_path=tmp_path,
        )
    )
    thread = device.start()
    rng = np.random.default_rng(0)
    latencies_ms = []
    counts = []
    try:
        for i in range(200):
            stim = StimCommand(i + 1, tuple(rng.uniform(4, 40, N_ENCODING)), tuple(rng.uniform(1.0, 2.5, N_ENCODING)))
            t0 = time.perf_counter()
            tx.sendto(encode_stim(stim), ("127.0.0.1", device.stim_port))
            # The first reply waits for cl.open() (the simulator's workers start; seconds on a busy machine). Later
            # ones are due in 10 ms, but cl-sdk's clock can stall for seconds when the machine is loaded; a device
            # that died fails at once (recv_reply watches its thread), so a generous wait hides nothing.
            reply = recv_reply(rx, thread, 120.0 if i == 0 else 30.0)
            latencies_ms.append((time.perf_counter() - t0) * 1e3)
            assert reply.timestamp_us == stim.timestamp_us
            counts.append(reply.counts)
            if i % 20 == 0:
                fb = FeedbackCommand(1, FeedbackType.REWARD, (19, 20, 22), 20, 2.0, 3)
                tx.sendto(encode_feedback(fb), ("127.0.0.1", device.feedback_port))
            if i % 50 == 49:
                tx.sendto(
                    encode_feedback(FeedbackCommand(2, FeedbackType.INTERRUPT, (19, 20, 22))),
                    ("127.0.0.1", device.feedback_port),
                )
                event = EventMessage(3, "episode_end", {"episode": i // 50, "episode_reward": 1.0})
                tx.sendto(encode_event(event), ("127.0.0.1", device.event_port))
        tx.sendto(b"not a datagram", ("127.0.0.1", device.stim_port))
        time.sleep(0.05)
        tx.sendto(
            encode_event(EventMessage(4, "training_complete", {"reason": "test"})), ("127.0.0.1", device.event_port)
        )
        thread.join(30)
    finally:
        device.stop()  # a no-op after training_complete; on a failure it closes the device and its workers
        thread.join(30)
        rx.close()
        tx.close()
    assert not thread.is_alive()
    assert device.exit_reason == "training_complete"
    assert device.counters["replies"] == 200
    assert device.counters["feedback"] == 14
    assert device.counters["event_episode_end"] == 4
    assert device.counters["malformed_stim"] == 1
    print(
        f"cl-sdk reply latency median {np.median(latencies_ms):.2f} ms for 5 + 5 ms windows; "
        f"mean counts {np.mean(counts, axis=0).round(2)}"
    )
    files = device.recording_files()
    assert len(files) == 1 and files[0].exists() and files[0].suffix == ".h5"
    assert files[0].stat().st_size > 0
    import cl

    view = cl.RecordingView(str(files[0]))
    try:
        streams = view.data_streams
        assert "spikeloop_events" in streams and "spikeloop_exchanges" in streams
    finally:
        view.close()
