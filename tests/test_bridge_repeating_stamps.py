"""A device whose stamps repeat (a 16 ms clock, a constant one) under faults: no reply taken for another stimulation.

Issue 51, item 3. The device is `python -m spikeloop.bridge.device.loopback_device` in its own process over
real UDP on loopback, answering at once (replies closer together than the clock's step, so consecutive answers
share a stamp) and encoding each stimulation in its reply (count i = frequency i): a reply taken for a
stimulation it does not answer shows in its counts. Duplicated replies are byte for byte the answer before
them, and with a stamp that repeats the bridge used to take such a copy for the next stimulation (before the
fix, 1-2 of about 270 replies taken with the 16 ms clock here; the issue saw 12 of 200 with duplicates alone on a
constant clock). A reply later than its horizon, past the probation window, was taken where it landed too, and
the reply it displaced in a later window (up to 8 of about 210 with the constant clock). Now a repeat is
refused, and after a write-off a reply later than the device answers, or beside a second one, is refused
(both counted `indistinct`); a constant clock is never learnt as one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.ports import free_port
from tests.support.faulty_device import start_faulty_device

TIMEOUT_S = 0.05
LATE_GRACE_S = 0.05  # horizon 0.1 s
EXCHANGES = 300
MIXED = {"drop": 0.03, "late": 0.03, "very_late": 0.03, "duplicate": 0.08, "corrupt": 0.03, "foreign": 0.03}

CASES = {
    "coarse-16ms-mixed": (["--clock-resolution-ms", "16"], MIXED),
    "constant-mixed": (["--constant-clock"], MIXED),
    "constant-duplicates": (["--constant-clock"], {"duplicate": 0.1}),
}


def start_device(spike_port: int, record: Path, clock: list[str], faults: dict[str, float], seed: int):
    """The faulty device in its own process, its clock repeating; returns it and where it listens."""
    return start_faulty_device(spike_port, record, seed, faults, *clock, timeout_s=TIMEOUT_S, late_grace_s=LATE_GRACE_S)


@pytest.mark.parametrize("case", list(CASES))
def test_no_reply_is_taken_for_another_stimulation_when_stamps_repeat(tmp_path: Path, case: str) -> None:
    clock, faults = CASES[case]
    record = tmp_path / "truth.jsonl"
    spike_port = free_port()
    proc, address = start_device(spike_port, record, clock, faults, seed=3)
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=TIMEOUT_S, late_grace_s=LATE_GRACE_S))
    rng = np.random.default_rng(3)
    sent: list[np.ndarray] = []
    misattributed = []  # (exchange, the exchanges whose stimulation the counts encode)
    taken = 0
    try:
        for i in range(EXCHANGES):
            freqs = rng.uniform(4, 40, 8).astype(np.float32)
            sent.append(freqs)
            reply = bridge.exchange(freqs, [1.5] * 8)
            if not reply.ok:
                assert not reply.counts.any()
                continue
            taken += 1
            if not np.array_equal(reply.counts, freqs):
                misattributed.append((i, [j for j, f in enumerate(sent) if np.array_equal(f, reply.counts)]))
        time.sleep(0.5)  # the late replies land and are counted
        stats = bridge.stats()
    finally:
        bridge.close()
        proc.terminate()
        proc.wait(timeout=10)
    truth = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(truth) == EXCHANGES
    duplicated = sum(t["fault"] == "duplicate" for t in truth)
    assert duplicated >= 5, duplicated  # the fault this is about really happened

    assert misattributed == [], (misattributed, stats)
    # The stamps did repeat, and what could not be told from a copy was refused and counted.
    assert stats["correlation"] == "arrival" and stats["indistinct"] >= 1, stats
    assert stats["ok"] == taken and taken >= EXCHANGES * 0.5, stats
    if clock == ["--constant-clock"]:
        assert not stats["reply_clock"]["ready"], stats  # a constant clock decides nothing
