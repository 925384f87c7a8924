"""What an experiment leaves listening beyond loopback: the refusal without `allow_network_bind`, and check's lines.

The trainer binds one UDP port per device (its spike port, on `bind_host`); a simulated device binds its command
ports there too. On loopback only this machine reaches them. A `bind_host` that is a wildcard (every interface), a
non-loopback address, or `auto` towards a remote device (`DeviceAddress.bind_leaves_loopback`) lets any host of that
network send to them: the schema refuses it unless the device says `allow_network_bind: true`, and `spikeloop check`
prints what listens where. A Ray that spikeloop starts itself listens on loopback only
(spikeloop.experiments.ray_session); one named in RAY_ADDRESS is the cluster's own.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from spikeloop.bridge.wire.address import AUTO_BIND, WILDCARD_HOSTS, DeviceAddress, is_loopback
from spikeloop.bridge.wire.settings import ALLOW_NETWORK_BIND
from spikeloop.models.closed_loop.settings import DeviceSettings

if TYPE_CHECKING:
    from spikeloop.experiments.schema import Experiment

LOOPBACK_HOST = "127.0.0.1"
OK, INFO = "[ok]  ", "[info]"
"""check's tags: loopback only; reachable from other hosts (acknowledged)."""


def where(address: DeviceAddress) -> str:
    """The trainer's bind host in words (not resolved: `auto` is found where the bridge binds)."""
    bind = address.bind_host
    if bind in WILDCARD_HOSTS:
        return f"every interface of the trainer's machine ({bind})"
    if bind == AUTO_BIND:
        return f"the trainer's interface that faces {address.host} (bind_host: {AUTO_BIND})"
    return bind if is_loopback(bind) else f"{bind}, an interface beyond loopback"


def replies_from(dev: DeviceSettings) -> str:
    """From where the bridge takes replies (devices.N.reply_port), in words."""
    host, reply = dev.address.host, dev.reply_port
    if dev.simulated:
        return "the simulated device's stimulation port"
    if reply == "any":
        return f"any port of {host} (reply_port: any: any process there can answer for the device)"
    if reply == "auto":
        return f"{host}, from the port of its first answer on (reply_port: auto)"
    if reply == "stim_port":
        return f"{host}:{dev.address.stim_port} (reply_port: stim_port)"
    return f"{host}:{reply} (reply_port)"


def device_exposure(dev: DeviceSettings, bind_host: str | None = None) -> str:
    """What listens for this device and where: `bind_host` the resolved one, if known."""
    address = dev.address
    place = bind_host or where(address)
    if dev.simulated:
        return (
            f"simulated device {dev.device_id!r}: its command ports (taken only from the bridge's port) and the "
            f"trainer's spike port, free UDP ports on {place}"
        )
    spike = address.spike_port or "a free port"
    return (
        f"the trainer's UDP spike port {spike} for device {dev.device_id!r} on {place}; replies are taken only "
        f"from {replies_from(dev)}, anything else is counted and dropped"
    )


def refusal(index: int, dev: DeviceSettings) -> str | None:
    """The schema's message for a bind beyond loopback that the device does not acknowledge; None: nothing to say."""
    if dev.allow_network_bind or not dev.address.bind_leaves_loopback():
        return None
    key = f"devices.{index}.{ALLOW_NETWORK_BIND.name}"
    advice = (
        f"a simulated device runs beside the trainer: use bind_host: {LOOPBACK_HOST}"
        if dev.simulated
        else (
            f"for a device on this machine use bind_host: {LOOPBACK_HOST}; for a remote one use bind_host: "
            f"{AUTO_BIND} (only the interface that faces it) and acknowledge the exposure with {key}: true"
        )
    )
    return (
        f"devices.{index}.bind_host: {dev.address.bind_host!r} (device host {dev.address.host}) would listen beyond "
        f"loopback: {device_exposure(dev)}; any host that reaches that interface can send to it. {key} is not set: "
        f"{advice}"
    )


def ray_line() -> str:
    """Where the run's Ray listens."""
    if os.environ.get("RAY_ADDRESS"):
        return (
            f"Ray: joins the cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']}; its processes listen where that "
            "cluster was started (ray start --node-ip-address, --dashboard-host)"
        )
    return (
        f"Ray: spikeloop starts its own on this machine, on {LOOPBACK_HOST} only (GCS, raylet, object manager, "
        "workers and agents; no dashboard)"
    )


def exposure_lines(experiment: Experiment) -> list[str]:
    """`spikeloop check`'s network lines: each device's listening port and where, the live view, Ray."""
    lines = []
    beyond = False
    for i, dev in enumerate(experiment.devices):
        address = dev.address
        resolved = None
        if address.bind_host == AUTO_BIND:
            try:
                resolved = address.resolved().bind_host
            except OSError as exc:
                lines.append(f"[warn] network: devices.{i}.{exc}")
        if resolved is not None:
            resolved = (
                f"{resolved} ({where(address)}, as seen from this machine; train resolves it on the device's node)"
            )
        leaves = address.bind_leaves_loopback()
        beyond = beyond or leaves
        lines.append(f"{INFO if leaves else OK} network: devices.{i}: {device_exposure(dev, resolved)}")
        if leaves and address.bind_host in WILDCARD_HOSTS:
            lines.append(
                f"[warn] network: devices.{i}.bind_host {address.bind_host} listens on every interface; "
                f"bind_host: {AUTO_BIND} listens only on the one that faces {address.host}"
            )
    view = experiment.view
    if view.enabled:
        view_leaves = not is_loopback(view.host)
        beyond = beyond or view_leaves
        port = f"port {view.port} and up (one per env runner)" if view.port else "free ports"
        lines.append(f"{INFO if view_leaves else OK} network: the live view serves HTTP on {view.host}, {port}")
    lines.append(f"{OK} network: {ray_line()}")
    if beyond:
        lines.append(
            "[info] network: the listeners marked info above are reachable from other hosts of their network "
            "(acknowledged by allow_network_bind / view.host)"
        )
    return lines
