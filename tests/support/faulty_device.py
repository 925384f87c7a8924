"""`python -m spikeloop.bridge.device.loopback_device` in its own process, injecting faults and keeping the truth.

The device answers each stimulation with its frequencies as counts and records, one JSON line per stimulation,
the stamp of the reply it sent and the fault it injected, so a test can tell which reply answered what.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port


def start_faulty_device(
    spike_port: int,
    record: Path,
    seed: int,
    faults: dict[str, float],
    *flags: str,
    timeout_s: float,
    late_grace_s: float,
) -> tuple[subprocess.Popen, DeviceAddress]:
    """The device with `flags` (its clock, its ticks) and `faults`; late replies land past the bridge's timeout
    but inside its horizon, very late ones past the horizon. Returns it and where it listens."""
    stim_port = free_port()
    # fmt: off
    args = [sys.executable, "-m", "spikeloop.bridge.device.loopback_device",
            "--spike-port", str(spike_port), "--stim-port", str(stim_port), *flags,
            "--late-s", f"{timeout_s + 0.005},{timeout_s + late_grace_s - 0.005}",
            "--very-late-s", f"{timeout_s + late_grace_s + 0.01},0.4",
            "--seed", str(seed), "--record", str(record)]
    # fmt: on
    for kind, rate in faults.items():
        args += ["--fault", f"{kind}={rate}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ports = dict(item.split("=") for item in proc.stdout.readline().split())
    address = DeviceAddress(
        spike_port=spike_port,
        stim_port=stim_port,
        feedback_port=int(ports["feedback_port"]),
        event_port=int(ports["event_port"]),
    )
    return proc, address
