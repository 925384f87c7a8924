"""Kill a CL1Bridge actor mid-run and keep exchanging: run as its own process by test_bridge_actor.

Its own process so that a Ray session with a SIGKILLed actor in it never shares a process
with the rest of the suite. Exit status 0 means every check held.
Usage: python -m tests.support.bridge_restart_check {local-socket|actor-calls}
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import ray

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.trainer.actor import start_bridge
from spikeloop.bridge.trainer.client import BridgeClient
from spikeloop.bridge.trainer.core import BridgeConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port


def main(path: str) -> int:
    """Run the scenario; raise AssertionError on any broken expectation."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    device = LoopbackDevice(spike_port=free_port())
    device.start()
    address = DeviceAddress(
        spike_port=device.spike_port,
        stim_port=device.stim_port,
        feedback_port=device.feedback_port,
        event_port=device.event_port,
    )
    bridge = start_bridge(BridgeConfig(device_id=f"dish-b-{path}", address=address, timeout_s=0.5))
    client = BridgeClient(bridge, fast_path=path == "local-socket")
    rng = np.random.default_rng(0)
    pids = set()
    for step in range(60):
        if step == 20:
            os.kill(ray.get(bridge.pid.remote()), signal.SIGKILL)  # mid-run, as a crash would
        freqs = rng.uniform(4, 40, 8).astype(np.float32)
        reply = client.exchange(freqs, [1.5] * 8)
        assert reply.ok, f"step {step}: {reply.status}"
        np.testing.assert_array_equal(reply.counts, freqs)
        pids.add(ray.get(bridge.pid.remote()))
    assert client.path == ("local socket" if path == "local-socket" else "actor calls"), client.path
    assert len(pids) == 2, pids
    assert client.restarts_seen == 1, client.restarts_seen
    stats = client.stats()
    assert stats["restarted"] is True
    assert stats["spike_port"] == device.spike_port  # the same port, bound again
    client.close()
    ray.kill(bridge, no_restart=True)
    device.stop()
    print(f"ok: {path}: 60 exchanges across a restart, pids {sorted(pids)}", flush=True)
    os._exit(0)  # skip ray.shutdown(): see the module docstring


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
