"""Joining Ray: the cluster named in RAY_ADDRESS, or a private local one (the runner and `watch` both start here)."""

from __future__ import annotations

import os


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
