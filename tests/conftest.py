"""Shared fixtures: one Ray session per test module, loopback helpers."""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port that is free right now on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance shared by every test in the module."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
