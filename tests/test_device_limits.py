"""What many valid commands add up to at the device: the pulse-rate ceiling, a bounded dose book, no settle stall.

Through the front door: `spikeloop bench flood` runs `spikeloop device` as its own process and floods it with
commands each inside the envelope (about 1,000 a second: a burst restarted on every encoding electrode every
millisecond, feedback bursts on top of running ones), then rebuilds every pulse the culture gave from the device's
recording. Before the ceiling a flood like it pulsed one electrode up to 497 times a second (issue 51).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.backends import burst_charge_nc
from spikeloop.bridge.device.dose import DOSE_BINS, DoseBudget, DoseMeter
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    decode_spikes,
    encode_feedback,
    encode_stim,
)
from spikeloop.experiments.benchmarks.flood import device_rss_mb
from tests.support.device_client import ROOT, Client, start_device, stop_device


@pytest.mark.parametrize("stim_mode", ["burst", "reference"])
def test_a_flood_of_valid_commands_keeps_every_electrode_under_the_ceiling(tmp_path: Path, stim_mode: str) -> None:
    output = tmp_path / "flood.json"
    run = subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "bench", "flood", "--duration-s", "4",
         "--stim-mode", stim_mode, "--output", str(output)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(output.read_text())
    summary, counters = result["summary"], result["raw"]["device_counters"]
    assert summary["passed"], summary
    assert summary["closest_pulses_ms"] >= 5.0 - 1e-6 and summary["most_pulses_in_1_s"] <= 200
    # The flood asked for more than the ceiling allows: the device held it (and said so), it did not go unasked.
    assert counters["rate_refused_stim"] + counters["rate_deferred_stim"] > counters["stim"] / 2
    assert summary["pulses_total"] > 1000


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client()
    yield c
    c.sock.close()


def test_the_longest_feedback_burst_does_not_stall_a_settling_device(client: Client) -> None:
    # 200 pulses at 1 Hz: the longest burst the envelope allows, 199 s. With settle on, the stimulations after it
    # were held until its last pulse (issue 51: unanswered for about 199 s); now at most --feedback-settle-max-hold-ms
    # (5 s by default, 300 ms here so that the socket's 5 s tell the two apart).
    proc = start_device(client, "--feedback-settle-ms", "20", "--artifact-wait-ms", "10",
                        "--collect-window-ms", "10", "--feedback-settle-max-hold-ms", "300", realtime=True)  # fmt: skip
    try:
        longest = FeedbackCommand(10, FeedbackType.REWARD, (19, 20, 22), 1, 2.0, 200, False, "reward")
        client.sock.sendto(encode_feedback(longest), ("127.0.0.1", client.ports["feedback"]))
        time.sleep(0.1)
        answered_within_s = []
        for stamp in range(100, 105):
            sent = time.monotonic()
            client.sock.sendto(
                encode_stim(StimCommand(stamp, (20.0,) * 8, (1.5,) * 8)), ("127.0.0.1", client.ports["stim"])
            )
            assert decode_spikes(client.sock.recv(4096)).timestamp_us == stamp  # within the socket's 5 s
            answered_within_s.append(time.monotonic() - sent)
    finally:
        summary = stop_device(proc)
    assert summary["settle_capped"] >= 1
    assert summary.get("refused_feedback", 0) == summary.get("rate_refused_feedback", 0) == 0  # the burst was taken
    assert summary["feedback"] == 1


def test_the_dose_book_stays_bounded_on_a_clock_that_does_not_move() -> None:
    # An unpaced device's clock does not move on feedback: 688 bytes were kept per command for 60 s of that clock,
    # and 400k commands grew a device from 194 to 531 MB (issue 51). Now a fixed number of one-second bins.
    meter = DoseMeter(DoseBudget())
    charges = np.zeros(64)
    charges[19] = 0.24
    for _ in range(50_000):
        meter.deliver(12.0, charges)
    for i in range(500):
        meter.deliver(12.0 + i * 0.5, charges)
    assert len(meter._bins) <= DOSE_BINS
    assert meter.session_nc[19] == pytest.approx(0.24 * 50_500)
    assert meter.per_min_nc(12.0 + 499 * 0.5)[19] == pytest.approx(0.24 * 121, rel=0.02)


def test_a_burst_cut_short_is_booked_as_far_as_it_ran(client: Client) -> None:
    # Booked whole, every interrupted burst counted pulses never given: the trainer interrupts before each negative
    # feedback, so a budget had to allow many times what reached the tissue.
    proc = start_device(client, "--artifact-wait-ms", "50", "--collect-window-ms", "50")
    try:
        burst = FeedbackCommand(10, FeedbackType.REWARD, (23,), 20, 2.0, 40, True, "reward_negative")  # 2 s
        client.sock.sendto(encode_feedback(burst), ("127.0.0.1", client.ports["feedback"]))
        client.stim(11, (0.0,) * 8, (0.0,) * 8)  # 100 ms of culture time: pulses at 0, 50 and 100 ms
        cut = FeedbackCommand(12, FeedbackType.INTERRUPT, (23,), event_name="reward_negative")
        client.sock.sendto(encode_feedback(cut), ("127.0.0.1", client.ports["feedback"]))
        client.stim(13, (0.0,) * 8, (0.0,) * 8)
        dose = client.status()["dose"]
    finally:
        stop_device(proc)
    per_pulse = burst_charge_nc(2.0, 1)
    assert dose["max_nc_session_electrode"] == 23
    assert dose["max_nc_session"] == pytest.approx(3 * per_pulse)  # not 40 pulses' worth


def test_memory_stays_flat_under_a_flood_of_valid_feedback(client: Client) -> None:
    # Issue 51: 400k valid feedback datagrams grew an unpaced device from 194 to 531 MB in 23 s, linearly.
    proc = start_device(client)  # unpaced: its clock does not move on feedback
    feedback = [
        encode_feedback(FeedbackCommand(i, FeedbackType.REWARD, channels, 20, 2.0, 30, False, "reward"))
        for i, channels in enumerate(((19, 20, 22), (23, 24, 26), (35, 36, 38), (44, 47, 48)))
    ]
    try:
        rss_mb = []
        for _ in range(4):
            for i in range(20_000):
                client.sock.sendto(feedback[i % 4], ("127.0.0.1", client.ports["feedback"]))
                if i % 250 == 249:  # answered once the device has taken in the feedback sent before it
                    client.stim(7, (0.0,) * 8, (0.0,) * 8)
            rss_mb.append(device_rss_mb(proc.pid))
    finally:
        summary = stop_device(proc)
    assert summary["feedback"] > 60_000  # loopback may drop some; most arrived
    assert max(rss_mb) - rss_mb[0] < 10.0, rss_mb
