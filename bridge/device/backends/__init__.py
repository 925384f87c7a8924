"""Device backends behind one interface (`Backend`): sim, cl, random, zero and transparent.

`make_backend` builds one by name; only `cl` needs the optional `cl` package,
and it is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spikeloop.bridge.device.backends.base import (
    STIM_MODES,
    Backend,
    JsonlRecorder,
    burst_charge_nc,
    burst_pulses,
    group_matrix,
    stim_charge_nc,
    stim_pulses,
)
from spikeloop.bridge.wire.settings import (
    CULTURE_SEED,
    CULTURE_STATE,
    DEVICE_BACKEND,
    DEVICE_REALTIME,
    RANDOM_SPIKE_RATE_HZ,
    SEED,
    STIM_MODE,
)

if TYPE_CHECKING:
    from collections.abc import Collection
    from pathlib import Path

    from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig

BACKEND_NAMES = DEVICE_BACKEND.choices

__all__ = [
    "BACKEND_NAMES",
    "STIM_MODES",
    "Backend",
    "JsonlRecorder",
    "burst_charge_nc",
    "burst_pulses",
    "group_matrix",
    "make_backend",
    "stim_charge_nc",
    "stim_pulses",
]


def make_backend(
    name: str,
    *,
    tick_frequency_hz: float,
    seed: int = SEED.default,
    realtime: bool = DEVICE_REALTIME.default,
    random_spike_rate_hz: float = RANDOM_SPIKE_RATE_HZ.default,
    cl_sim_culture: bool = False,
    max_pulses: int | None = None,
    culture: SimulatedCultureConfig | None = None,
    stim_mode: str = STIM_MODE.default,
    culture_seed: int | None = CULTURE_SEED.default,
    culture_fixed: Collection[str] = (),
    culture_state: Path | None = CULTURE_STATE.default,
) -> Backend:
    """Build the named backend with the device's settings (`max_pulses`: the cl backend's burst cap;
    `culture`: the sim backend's culture knobs, None for the defaults; `culture_seed`, `culture_fixed` and
    `culture_state`: which culture, and its saved state, as `DeviceConfig` says).

    `stim_mode` (STIM_MODES) reaches the backends that stimulate tissue, sim and cl; random, zero and
    transparent stimulate nothing, so it changes nothing there.
    """
    if stim_mode not in STIM_MODES:
        raise ValueError(f"unknown stim_mode {stim_mode!r}; choose from {', '.join(STIM_MODES)}")
    if (culture is not None or culture_seed is not None or culture_state is not None) and name != "sim":
        raise ValueError(f"culture settings are for the sim backend's simulated culture, not backend {name!r}")
    if name == "sim":
        from spikeloop.bridge.device.backends.sim import SimBackend

        return SimBackend(
            tick_frequency_hz,
            seed=seed,
            realtime=realtime,
            culture_config=culture,
            stim_mode=stim_mode,
            culture_seed=culture_seed,
            culture_fixed=culture_fixed,
            culture_state=culture_state,
        )
    if name == "cl":
        from spikeloop.bridge.device.backends.cl import ClBackend

        return ClBackend(
            tick_frequency_hz,
            sim_culture_seed=seed if cl_sim_culture else None,
            max_pulses=max_pulses,
            stim_mode=stim_mode,
        )
    if name == "random":
        from spikeloop.bridge.device.backends.random_counts import RandomBackend

        return RandomBackend(tick_frequency_hz, spike_rate_hz=random_spike_rate_hz, seed=seed, realtime=realtime)
    if name == "zero":
        from spikeloop.bridge.device.backends.zero import ZeroBackend

        return ZeroBackend(tick_frequency_hz, realtime=realtime)
    if name == "transparent":
        from spikeloop.bridge.device.backends.transparent import TransparentBackend

        return TransparentBackend(tick_frequency_hz, realtime=realtime)
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKEND_NAMES)}")
