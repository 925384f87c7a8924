"""A device without echo (its own clock, offset and drifting) under mixed faults: no reply is ever misattributed.

The device is `python -m spikeloop.bridge.device.loopback_device` in its own process, over real UDP
on loopback, answering on 5 ms ticks. It drops replies, sends some late (past the timeout, within the
horizon) and some very late (past the horizon), duplicates some, sends some
truncated and forges some from another address, a few percent each. It records
the truth in a file of its own, never on the wire: for every stimulation, the
stamp of the reply it sent. A reply the bridge takes is right only if the
device sent that reply for that stimulation.

(By arrival order alone, before the bridge learnt the device clock, 107 of 2,856
replies taken over seeds 1-8 of this soak answered another stimulation; with
it, none of 2,829: docs/architecture.md, "Devices without echo".)
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.loopback_device import PLAN_FAULTS
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port
from tests.support.faulty_device import start_faulty_device

TIMEOUT_S = 0.05
LATE_GRACE_S = 0.05  # horizon 0.1 s
FAULT_RATE = 0.03  # each of the six kinds
EXCHANGES = 400
TICK_S = 0.005  # replies leave on the device's ticks, 5-10 ms after the stimulation


def start_device(spike_port: int, record: Path, seed: int) -> tuple[subprocess.Popen, DeviceAddress]:
    """The faulty own-clock device in its own process; returns it and where it listens."""
    faults = {kind: FAULT_RATE for kind in PLAN_FAULTS}
    clock = ("--clock-offset-s", "-37.5", "--clock-drift-ppm", "200", "--tick-s", str(TICK_S))
    return start_faulty_device(spike_port, record, seed, faults, *clock, timeout_s=TIMEOUT_S, late_grace_s=LATE_GRACE_S)


# The long tier: the device program shares the machine with the test, and at load averages of 13 to 19 on two
# cores it was seen to stall for 290 ms (three times the horizon) on one stimulation while the next one's reply
# was dropped. A stall longer than the bridge's stall memory that hides its own evidence is beyond what stamps
# can tell (docs/architecture.md, "Devices without echo"): 1 misattribution in 40 runs of 400 there, none on a
# quiet machine, none in the hour-long `bench soak`.
@pytest.mark.long
def test_no_reply_is_misattributed_under_mixed_faults(tmp_path: Path) -> None:
    record = tmp_path / "truth.jsonl"
    spike_port = free_port()
    proc, address = start_device(spike_port, record, seed=5)
    bridge = BridgeCore(BridgeConfig(address=address, timeout_s=TIMEOUT_S, late_grace_s=LATE_GRACE_S))
    rng = np.random.default_rng(5)
    taken = []  # (stimulation stamp, reply stamp, counts equal the frequencies)
    try:
        for _ in range(EXCHANGES):
            freqs = rng.uniform(4, 40, 8).astype(np.float32)
            reply = bridge.exchange(freqs, [1.5] * 8)
            if reply.ok:
                taken.append((reply.stim_timestamp_us, reply.reply_timestamp_us, np.array_equal(reply.counts, freqs)))
            else:
                assert not reply.counts.any()
        time.sleep(0.5)  # the very late replies land and are counted
        stats = bridge.stats()
    finally:
        bridge.close()
        proc.terminate()
        proc.wait(timeout=10)
    truth = [json.loads(line) for line in record.read_text().splitlines()]
    sent_for = {t["reply_us"]: t["stim_us"] for t in truth if t["fault"] != "drop"}
    assert len(truth) == EXCHANGES and len(sent_for) == len([t for t in truth if t["fault"] != "drop"])
    injected = {kind: sum(t["fault"] == kind for t in truth) for kind in ("drop", "delay", "duplicate", "corrupt")}
    assert min(injected.values()) >= 5, injected  # every kind of fault really happened
    assert stats["foreign"] >= 5 and stats["malformed"] == injected["corrupt"], stats

    misattributed = [(stim, got) for stim, got, _ in taken if sent_for.get(got) != stim]
    assert misattributed == [], (len(misattributed), stats)
    assert all(counts_match for _, _, counts_match in taken)  # the counts say so too
    # The device clock was learnt (stamps decided), and what could not be attributed was written off and counted.
    assert stats["correlation"] == "arrival" and stats["reply_clock"]["ready"], stats
    assert stats["ok"] == len(taken) and stats["late"] >= 5, stats
    assert len(taken) >= EXCHANGES * 0.7, stats  # the faults cost about a fifth, not the run
