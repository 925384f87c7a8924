"""The trainer's side of the wire: one device's sockets and correlation (core), its Ray actor, the env runner's client."""
