"""The `random` ablation backend: Poisson spike counts that ignore the stimulation."""

from __future__ import annotations

import numpy as np

from spikeloop.bridge.device.backends.zero import ZeroBackend
from spikeloop.bridge.wire.channels import SPIKE_GROUPS


class RandomBackend(ZeroBackend):
    """Each recorded electrode fires as a Poisson process at `spike_rate_hz`, seeded."""

    name = "random"

    def __init__(self, tick_frequency_hz: float, spike_rate_hz: float, seed: int, realtime: bool) -> None:
        super().__init__(tick_frequency_hz, realtime=realtime)
        self.spike_rate_hz = spike_rate_hz
        self._rng = np.random.default_rng(seed)
        self._electrodes_per_group = np.array([len(es) for es in SPIKE_GROUPS.values()], dtype=np.float64)

    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """A sum of independent Poisson electrodes is Poisson with the summed rate."""
        window_s = max(0.0, end_s - start_s)
        return self._rng.poisson(self.spike_rate_hz * window_s * self._electrodes_per_group).astype(np.float64)
