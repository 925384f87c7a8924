"""Joining Ray: the cluster named in RAY_ADDRESS, or a private local one (the runner and `watch` both start here).

A Ray that spikeloop starts itself serves this machine only, so it listens on loopback only: its GCS, raylet, object
manager, workers and agents bind 127.0.0.1 (`loopback_node`), where Ray's default is every interface. A cluster named
in RAY_ADDRESS (`ray job submit`, `ray start`) listens where it was started; spikeloop only joins it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

LOOPBACK_HOST = "127.0.0.1"


@contextlib.contextmanager
def loopback_node() -> Iterator[dict[str, str]]:
    """Start a local Ray inside the block on loopback only: the keyword arguments `ray.init` needs for it.

    Ray 2.60 turns a node address of 127.0.0.1 into the machine's network address unless its single-machine mode
    (`ray_constants.ENABLE_RAY_CLUSTER` false, as on macOS and Windows) is on; with it, its gRPC servers bind
    127.0.0.1 instead of 0.0.0.0 and its agents their node's address. The driver read that constant when it imported
    Ray, so it is switched for the start only and restored after (a `ray start` this process runs later, e.g. a
    test's cluster, keeps Ray's default).
    tests/test_exposure.py lists the sockets of the processes to show it.
    """
    from spikeloop.models.ray_internals import single_machine_mode

    with single_machine_mode():
        yield {"_node_ip_address": LOOPBACK_HOST}


def init_ray(resources: dict[str, float] | None = None) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), or start a private local Ray.

    `resources`: custom resources the local node advertises, e.g. `CultureSettings.node_resources()` (ignored when
    joining a cluster, whose nodes declare their own with `ray start --resources`).
    """
    import ray

    from spikeloop.models import rllib_notices

    rllib_notices.install()  # before Ray starts: its start-up notices too
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        with loopback_node() as loopback:
            ray.init(address="local", include_dashboard=False, resources=resources or None, **loopback)


@contextlib.contextmanager
def private_ray(resources: dict[str, float] | None = None) -> Iterator[None]:
    """A benchmark's own local Ray for the block, whatever RAY_ADDRESS says: 2 logical CPUs, no dashboard, the
    workers' logs kept out of the benchmark's output (`resources`: custom resources the node advertises)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with loopback_node() as loopback:
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            resources=resources or None,
            **loopback,
        )
    try:
        yield
    finally:
        ray.shutdown()
