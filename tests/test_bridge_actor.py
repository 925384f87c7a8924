"""The CL1Bridge Ray actor: named, pinned, restarted by Ray with its ports bound again."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.trainer.actor import bridge_actor_name, device_resource, find_bridge, start_bridge
from spikeloop.bridge.trainer.client import BridgeClient
from spikeloop.bridge.trainer.core import BridgeConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, decode_event

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_with_device_resource():
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        resources={device_resource("dish-a"): 1},
    )
    yield ray
    ray.shutdown()


@pytest.fixture()
def device():
    dev = LoopbackDevice(spike_port=free_port())
    dev.start()
    yield dev
    dev.stop()


def config_for(dev: LoopbackDevice, device_id: str) -> BridgeConfig:
    address = DeviceAddress(
        spike_port=dev.spike_port, stim_port=dev.stim_port, feedback_port=dev.feedback_port, event_port=dev.event_port
    )
    return BridgeConfig(device_id=device_id, address=address, timeout_s=0.5)


def test_named_pinned_and_found(ray_with_device_resource, device):
    ray = ray_with_device_resource
    bridge = start_bridge(config_for(device, "dish-a"), resource=device_resource("dish-a"))
    reply = ray.get(bridge.exchange.remote([12.0] * 8, [1.5] * 8))
    assert reply.ok and reply.counts.tolist() == [12.0] * 8
    assert ray.get(bridge.node_id.remote()) == ray.get_runtime_context().get_node_id()
    again = find_bridge("dish-a")
    assert ray.get(again.pid.remote()) == ray.get(bridge.pid.remote())
    # Asking again with the same device id returns the same actor, never a second socket owner.
    same = start_bridge(config_for(device, "dish-a"), resource=device_resource("dish-a"))
    assert ray.get(same.pid.remote()) == ray.get(bridge.pid.remote())
    ray.get(bridge.close.remote())
    ray.kill(bridge, no_restart=True)


@pytest.mark.parametrize("fast_path", [True, False])
def test_client_exchanges_sends_feedback_and_events_on_either_path(ray_with_device_resource, device, fast_path):
    ray = ray_with_device_resource
    bridge = start_bridge(config_for(device, f"dish-c-{fast_path}"))
    client = BridgeClient(bridge, fast_path=fast_path)
    reward = FeedbackCommand(0, FeedbackType.REWARD, (19, 20, 22), 20, 2.0, 30, False, "reward")
    try:
        assert client.exchange([12.0] * 8, [1.5] * 8).counts.tolist() == [12.0] * 8
        assert client.path == ("local socket" if fast_path else "actor calls")
        client.send_feedback([reward])
        assert client.exchange([13.0] * 8, [1.5] * 8).counts.tolist() == [13.0] * 8
        client.send_feedback([reward])  # over actor calls it is held back: the events call takes it first
        client.send_events([("episode_end", {"episode": 1})])
        stats = client.stats()
        assert (stats["exchanges"], stats["ok"], stats["feedback_sent"], stats["events_sent"]) == (2, 2, 2, 1)
        deadline = time.monotonic() + 5
        # episode_end, then the bridge's own status_request (for the device's dose; bridge/trainer/core.py)
        while (len(device.received_feedback), len(device.received_events)) != (2, 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (len(device.received_feedback), len(device.received_events)) == (2, 2)
        assert [decode_event(e).event_type for e in device.received_events] == ["episode_end", "status_request"]
    finally:
        client.close()
        ray.kill(bridge, no_restart=True)


def test_missing_bridge_is_a_clear_error(ray_with_device_resource):
    with pytest.raises(LookupError, match="no bridge actor for device 'nope'"):
        find_bridge("nope")


@pytest.mark.parametrize("path", ["local-socket", "actor-calls"])
def test_killed_bridge_is_restarted_and_keeps_serving(path):
    # In a process of its own (see tests/support/bridge_restart_check.py for why and for the checks).
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.bridge_restart_check", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"ok: {path}" in proc.stdout


def test_actor_name():
    assert bridge_actor_name("dish-b") == "cl1-bridge:dish-b"
