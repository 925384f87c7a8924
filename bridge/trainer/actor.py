"""`CL1Bridge`: the named Ray actor that owns one device's sockets.

One actor per device, named from the device id in the `spikeloop` namespace so
env runners, watch mode and tools all find the same one. It is restarted by Ray
if its process dies (sockets are re-bound in `__init__`; a dead process's UDP
ports are free at once) and is pinned to the node that owns the device, either
by a custom resource or by node id, so the UDP hop stays local. It is never
placed in its creator's placement group: an env runner under Tune runs inside
its trial's placement group, whose bundles hold no device resource, so a
captured bridge could never be scheduled.

Exchanges are not retried on restart: a stimulation that may already have
reached the culture must not be silently sent twice. Callers see the actor
error and decide; `spikeloop.bridge.trainer.client.BridgeClient` waits for the restart and
repeats the exchange as a new tick.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.trainer.local_channel import LocalChannelServer
from spikeloop.bridge.wire.protocol import FeedbackCommand

NAMESPACE = "spikeloop"
DEVICE_RESOURCE_SHARE = 0.001
"""How much of a node's `cl1:<device_id>` resource a bridge (or an env runner) asks for: enough to pin it to that
node, little enough that the bridge, its env runner and a driver's task all fit beside each other."""


def bridge_actor_name(device_id: str) -> str:
    """The Ray actor name of a device's bridge."""
    return f"cl1-bridge:{device_id}"


def device_resource(device_id: str) -> str:
    """The custom resource a node advertises when it owns a device (`ray start --resources`)."""
    return f"cl1:{device_id}"


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class CL1Bridge(BridgeCore):
    """BridgeCore as a restartable Ray actor (see `spikeloop.bridge.trainer.core` for the methods)."""

    def __init__(self, config: BridgeConfig) -> None:
        super().__init__(config)
        self._channel: LocalChannelServer | None = None
        self._owner: str | None = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Ray warns about its own internal use of a deprecated API here
            self._restarted = ray.get_runtime_context().was_current_actor_reconstructed

    def stats(self) -> dict[str, Any]:
        """Core stats plus whether this actor is a restart."""
        return super().stats() | {"restarted": self._restarted, "pid": os.getpid()}

    def local_channel(self) -> tuple[str, str, float]:
        """(node id, socket path, answer bound in s) of the exchange fast path, started on first use."""
        if self._channel is None:
            methods: dict[str, Callable[..., Any]] = {
                "feedback": self.feedback,  # posted feedback and feedback sent with an exchange
                "send_all": self.send_all,  # BridgeClient.send_events: held feedback, then events
                "stats": self.stats,
            }
            self._channel = LocalChannelServer(self.exchange, methods)
        # An exchange answers within the device timeout; anything far beyond it means a stuck actor.
        return ray.get_runtime_context().get_node_id(), self._channel.path, 2 * self.config.timeout_s + 30.0

    def close(self) -> None:
        """Close the exchange fast path, then the device sockets."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        super().close()

    def send_all(self, feedback: Sequence[FeedbackCommand], events: Sequence[tuple[str, dict]] = ()) -> int:
        """Send feedback commands then events in one call; returns how many feedback commands went out."""
        sent = sum(bool(self.feedback(command)) for command in feedback)
        for event_type, data in events:
            self.event(event_type, data)
        return sent

    def claim(self, owner: str) -> str | None:
        """Take the device for `owner`; returns the current owner instead if someone else holds it."""
        current = getattr(self, "_owner", None)
        if current is not None and current != owner:
            return current
        self._owner = owner
        return None

    def release(self, owner: str) -> None:
        """Give the device back (only its owner can)."""
        if getattr(self, "_owner", None) == owner:
            self._owner = None

    def get_config(self) -> BridgeConfig:
        """The settings this bridge runs with."""
        return self.config

    def spike_port_bound(self) -> int:
        """The spike port this actor bound (useful when configured as 0)."""
        return self.spike_port

    def pid(self) -> int:
        """The actor's process id."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()


def start_bridge(
    config: BridgeConfig,
    *,
    node_id: str | None = None,
    resource: str | None = None,
) -> ray.actor.ActorHandle:
    """Create the device's bridge actor, or return the running one with that name.

    `resource` (e.g. `device_resource(id)`) or `node_id` pins it to the device's node.
    """
    options: dict[str, Any] = {
        "name": bridge_actor_name(config.device_id),
        "namespace": NAMESPACE,
        "get_if_exists": True,
    }
    if resource is not None:
        # A tiny share of the device resource: pins the actor without using it up,
        # so the env runner that drives the device can ask for the same node.
        options["resources"] = {resource: DEVICE_RESOURCE_SHARE}
        # Not the caller's placement group (a trial's, under Tune): its bundles have no device resource.
        options["scheduling_strategy"] = "DEFAULT"
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    # mypy keeps a decorated class's own type: ray.remote's ActorClass (with .options) is invisible to it.
    return CL1Bridge.options(**options).remote(config)  # type: ignore[attr-defined]


def find_bridge(device_id: str) -> ray.actor.ActorHandle:
    """The running bridge actor of a device; a clear error if there is none."""
    try:
        return ray.get_actor(bridge_actor_name(device_id), namespace=NAMESPACE)
    except ValueError:
        raise LookupError(
            f"no bridge actor for device {device_id!r} in Ray namespace {NAMESPACE!r}; "
            "is the experiment running on this cluster?"
        ) from None
