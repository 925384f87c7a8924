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

Port 0 means "any free port" to the end that binds it: the trainer's `spike_port`,
the device's own three ports. The ports the trainer sends to must be real ones
(`require_device_ports`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from spikeloop.bridge.wire.channels import EVENT_PORT, FEEDBACK_PORT, SPIKE_PORT, STIM_PORT

DEVICE_PORTS = ("stim_port", "event_port", "feedback_port")
"""The ports the device binds and the trainer sends to."""
PORTS = (*DEVICE_PORTS, "spike_port")
HOSTS = ("host", "bind_host")


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

    def describe(self) -> str:
        """Both ends in one line (for messages)."""
        spike = self.spike_port or "a free port"
        return (
            f"{self.host}: stimulation port {self.stim_port}, feedback port {self.feedback_port}, event port "
            f"{self.event_port}; replies to {self.bind_host}:{spike}"
        )
