"""The `zero` ablation backend: no culture, every reply counts zero spikes.

On the wall clock by default (`spikeloop device --backend zero`); with `realtime=False`, as an experiment's
simulated devices run unless they say otherwise, the device moves the clock by exactly one window per
stimulation, as it does for the simulated culture, so the no-cells control costs no more time than a culture.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from spikeloop.bridge.device.backends.base import Backend
from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS
from spikeloop.bridge.wire.protocol import FeedbackCommand


class ZeroBackend(Backend):
    """Answers every stimulation with zero counts, on the wall clock or as fast as possible."""

    name = "zero"

    def __init__(self, tick_frequency_hz: float, realtime: bool) -> None:
        super().__init__(tick_frequency_hz)
        self.paced = realtime
        self._clock_s = 0.0

    def now_s(self) -> float:
        """Monotonic wall clock (real time) or the device-driven clock (as fast as possible)."""
        return time.monotonic() if self.paced else self._clock_s

    def advance_to(self, t_s: float) -> None:
        """As fast as possible: the clock jumps to `t_s`."""
        if not self.paced:
            self._clock_s = max(self._clock_s, t_s)

    def stimulate(self, at_s: float, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """Nothing to stimulate."""

    def feedback(self, at_s: float, command: FeedbackCommand) -> None:
        """Nothing to feed back to."""

    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """Zeros."""
        return np.zeros(N_SPIKE_GROUPS)
