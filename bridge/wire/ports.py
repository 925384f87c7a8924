"""A free local port for a device, a bridge or a test server to bind."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Literal


def free_port(host: str = "127.0.0.1", kind: Literal["udp", "tcp"] = "udp") -> int:
    """A `kind` port that is free on `host` right now (the OS picks it; the probe socket is closed again)."""
    # Racy but fine: between this close and the caller's bind the OS could hand the same port
    # to someone else. Ports come from the ephemeral range, which the OS cycles through rather
    # than reusing at once, so on a test or lab machine a clash is rare, and it fails loudly (bind error).
    sock_type = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, sock_type) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class DevicePorts:
    """A device's four UDP ports, free on loopback when chosen, fixed from then on (a restarted device reuses them)."""

    stim: int = field(default_factory=free_port)
    spike: int = field(default_factory=free_port)
    event: int = field(default_factory=free_port)
    feedback: int = field(default_factory=free_port)
