"""Where a CL1 device is reached: `DeviceAddress`, one type for both ends of the UDP link.

The bridge (`spikeloop.bridge.trainer.core.BridgeConfig`), the device program (`spikeloop.bridge.device.program.DeviceConfig`)
and an experiment's device (`spikeloop.models.closed_loop.settings.DeviceSettings`, the YAML's
flat `devices:` keys) each hold one `DeviceAddress`. The default ports come from
`spikeloop.bridge.wire.channels` (ports: docs/protocol.md).

The same six fields read the same way from both ends: `host` is always the device's
side and `bind_host` always the trainer's.

- The trainer (bridge) sends stimulation, events and feedback to `host` on
  `stim_port`, `event_port` and `feedback_port`, and binds `bind_host:spike_port`
  for the replies (it sends from there too).
- The device program binds its stimulation, event and feedback ports on `host`
  (its `--bind-host`; "0.0.0.0" listens on every interface) and replies to
  `bind_host:spike_port`, the trainer (its `--training-host` and `--spike-port`).
  So the device's `bind_host` must be an address that reaches the trainer, never
  "0.0.0.0" across machines.

The trainer's `bind_host` may be "auto" (`AUTO_BIND`): the interface of the trainer's machine that faces `host`,
found where the bridge binds (`resolved`; a loopback device stays on loopback). Whether a bind leaves loopback is
decided without resolving anything (`bind_leaves_loopback`): experiments refuse one that does unless the device
says `allow_network_bind: true` (spikeloop.experiments.exposure).

Port 0 means "any free port" to the end that binds it: the trainer's `spike_port`,
the device's own three ports. The ports the trainer sends to must be real ones
(`require_device_ports`).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, fields, replace

from spikeloop.bridge.wire.channels import EVENT_PORT, FEEDBACK_PORT, SPIKE_PORT, STIM_PORT

DEVICE_PORTS = ("stim_port", "event_port", "feedback_port")
"""The ports the device binds and the trainer sends to."""
PORTS = (*DEVICE_PORTS, "spike_port")
HOSTS = ("host", "bind_host")
AUTO_BIND = "auto"
"""The trainer's `bind_host` that names the interface facing the device (`DeviceAddress.resolved`)."""
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
"""Bind hosts that listen on every interface of the machine."""


def is_loopback(host: str) -> bool:
    """True for a loopback address or `localhost`; a host name is not resolved (any other name counts as not)."""
    name = host.strip().lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def facing_address(host: str) -> str:
    """This machine's address on the interface that faces `host`: the kernel's choice for a socket connected there.

    A UDP `connect` sends nothing; it only asks the routing table. OSError when no interface reaches `host`.
    """
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(sockaddr)
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise OSError(
            f"bind_host {AUTO_BIND}: no interface of this machine reaches the device host {host!r} "
            f"({getattr(exc, 'strerror', None) or exc}); check the device's host, or name the interface in bind_host"
        ) from None


@dataclass(frozen=True)
class DeviceAddress:
    """The device's host and ports, and the host the trainer binds its spike port on (see the module docstring)."""

    host: str = "127.0.0.1"
    """The device's host: the trainer sends there; the device program listens there."""
    stim_port: int = STIM_PORT
    spike_port: int = SPIKE_PORT
    """The trainer's port for spike replies (bound on `bind_host`); 0: any free port."""
    event_port: int = EVENT_PORT
    feedback_port: int = FEEDBACK_PORT
    bind_host: str = "127.0.0.1"
    """The trainer's host: it binds its spike port there; the device program replies there."""

    def __post_init__(self) -> None:
        for name in HOSTS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name}={value!r}: give a host name or IP address (e.g. 127.0.0.1)")
        for name in PORTS:
            port = getattr(self, name)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError(
                    f"{name}={port!r}: a UDP port is 1-65535 (0: any free port, for the end that binds it)"
                )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The fields, in order: the flat keys an experiment's `devices:` entry uses for them."""
        return tuple(f.name for f in fields(cls))

    def require_device_ports(self) -> None:
        """Refuse port 0 where the trainer sends: the device's stimulation, event and feedback ports."""
        for name in DEVICE_PORTS:
            if getattr(self, name) == 0:
                raise ValueError(
                    f"{name}=0: the trainer sends to this port of the device, so it must be 1-65535 "
                    "(the port the device program binds)"
                )

    def bind_leaves_loopback(self) -> bool:
        """Whether the trainer's bind is, or may be, reachable from other hosts: a wildcard, a non-loopback address,
        or `auto` towards a device that is not on loopback (decided without resolving a name)."""
        if self.bind_host == AUTO_BIND:
            return not is_loopback(self.host)
        return not is_loopback(self.bind_host)

    def resolved(self) -> DeviceAddress:
        """This address with `bind_host: auto` replaced by the interface facing `host` on this machine."""
        if self.bind_host != AUTO_BIND:
            return self
        return replace(self, bind_host=facing_address(self.host))

    def describe(self) -> str:
        """Both ends in one line (for messages)."""
        spike = self.spike_port or "a free port"
        return (
            f"{self.host}: stimulation port {self.stim_port}, feedback port {self.feedback_port}, event port "
            f"{self.event_port}; replies to {self.bind_host}:{spike}"
        )
