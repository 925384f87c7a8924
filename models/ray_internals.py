"""Every use of Ray's non-public API, in one place, each with the reason no public API serves.

Ray's private modules change without notice between releases. Whatever spikeloop needs from them goes through
the names here, and tests/test_ray_internals.py checks each one against the installed Ray, so that an
upgrade that moves them fails there, by name, instead of deep inside a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# RLlib's type of its `NotProvided` sentinel (only the instance is public); AlgorithmConfig subclasses that add
# keyword settings in RLlib's style need it to annotate them.
from ray.rllib.utils.from_config import _NotProvided as NotProvidedType  # noqa: F401  (re-exported)

# Checked by tests/test_ray_internals.py: each (module, attribute) this file reaches into.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("ray._private.utils", "get_num_cpus"),
    ("ray.rllib.utils.from_config", "_NotProvided"),
    ("ray.experimental.internal_kv", "_internal_kv_put"),
    ("ray.experimental.internal_kv", "_internal_kv_get"),
    ("ray.experimental.internal_kv", "_internal_kv_list"),
    ("ray._private.ray_constants", "ENABLE_RAY_CLUSTER"),
)


@contextlib.contextmanager
def single_machine_mode() -> Iterator[None]:
    """Ray's single-machine mode for a `ray.init` inside the block: its servers then bind the node address given
    (127.0.0.1) instead of every interface (no public API; experiments/ray_session.py says why). The driver read
    the constant when it imported Ray, so it is switched for the block only: a `ray start` later keeps the default."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def ray_cpu_count() -> int:
    """The CPU count a local Ray would offer: Ray's own count, which honours cgroup limits (no public API)."""
    from ray._private.utils import get_num_cpus

    return int(get_num_cpus())


def kv_put(key: str, value: str) -> None:
    """Store `value` under `key` in the cluster's key-value store (GCS), visible to the driver and every worker.

    Used for device-loss reports from env runners to the driver: Ray has no public cluster-wide key-value store.
    """
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True)


def kv_items(prefix: str) -> dict[str, str]:
    """Every key under `prefix` in the cluster's key-value store, with its value."""
    from ray.experimental import internal_kv

    items = {}
    for key in internal_kv._internal_kv_list(prefix) or []:
        raw = internal_kv._internal_kv_get(key)
        if raw:
            name = key.decode() if isinstance(key, bytes) else str(key)
            items[name] = raw.decode() if isinstance(raw, bytes) else str(raw)
    return items
