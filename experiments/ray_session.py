"""Joining Ray: the cluster named in RAY_ADDRESS, or a private local one (the runner and `watch` both start here)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


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
        ray.init(address="local", include_dashboard=False, resources=resources or None)


@contextlib.contextmanager
def private_ray(resources: dict[str, float] | None = None) -> Iterator[None]:
    """A benchmark's own local Ray for the block, whatever RAY_ADDRESS says: 2 logical CPUs, no dashboard, the
    workers' logs kept out of the benchmark's output (`resources`: custom resources the node advertises)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, resources=resources or None)
    try:
        yield
    finally:
        ray.shutdown()
