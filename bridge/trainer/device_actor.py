"""A device-side program (sim, random or zero backend) hosted in a Ray actor.

Experiments without hardware start one of these per env runner, on the env
runner's node, so that simulated cultures scale out exactly like real devices:
each has its own sockets, its own culture and its own bridge actor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spikeloop.bridge.device.program import Device, DeviceConfig


@ray.remote(num_cpus=0, max_restarts=0)
class SimulatedDevice:
    """Runs `spikeloop.bridge.device.program.Device` in a background thread of this actor."""

    def __init__(self, config: DeviceConfig) -> None:
        self.device = Device(config)
        self.thread = self.device.start()

    def ports(self) -> dict[str, int]:
        """The ports the device bound (stim, feedback, event)."""
        return {
            "stim_port": self.device.stim_port,
            "feedback_port": self.device.feedback_port,
            "event_port": self.device.event_port,
        }

    def counters(self) -> dict[str, Any]:
        """The device's own counters (datagrams handled, malformed, ...)."""
        return dict(self.device.counters)

    def node_id(self) -> str:
        """The Ray node this device runs on."""
        return ray.get_runtime_context().get_node_id()

    def stop(self) -> None:
        """Stop serving and close the recording."""
        self.device.stop()
        self.thread.join(timeout=5)


def start_simulated_device(config: DeviceConfig, *, node_id: str, name: str | None = None) -> ray.actor.ActorHandle:
    """Start a simulated device on `node_id` with free ports for stim, feedback and events."""
    config = replace(config, address=replace(config.address, stim_port=0, feedback_port=0, event_port=0))
    options: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}
    if name:
        options |= {"name": name, "namespace": "spikeloop", "get_if_exists": True}
    # mypy keeps a decorated class's own type: ray.remote's ActorClass (with .options) is invisible to it.
    return SimulatedDevice.options(**options).remote(config)  # type: ignore[attr-defined]
