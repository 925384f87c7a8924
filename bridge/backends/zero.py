"""The `zero` ablation backend: no culture, every reply counts zero spikes."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from bridge.backends.base import Backend
from bridge.channels import N_SPIKE_GROUPS
from bridge.protocol import FeedbackCommand


class ZeroBackend(Backend):
    """Answers every stimulation with zero counts, on the wall clock."""

    name = "zero"

    def now_s(self) -> float:
        """Monotonic wall clock."""
        return time.monotonic()

    def stimulate(self, at_s: float, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """Nothing to stimulate."""

    def feedback(self, at_s: float, command: FeedbackCommand) -> None:
        """Nothing to feed back to."""

    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """Zeros."""
        return np.zeros(N_SPIKE_GROUPS)
