"""The `transparent` backend: a perfect channel, the upper-bound control.

Its reply is a fixed, deterministic function of the stimulation it received: spike
group j counts `TRANSPARENT_MAX_COUNT` times the mean position of encoding electrode
j's frequency and amplitude within their ranges (`spikeloop.bridge.wire.channels`), so 0 counts for
the weakest stimulation and `TRANSPARENT_MAX_COUNT` for the strongest. Nothing is
lost, delayed or added: whatever the encoder puts on the wire reaches the decoder.
A closed loop through it shows what the learner can do with a culture that passes
everything on; a real or simulated culture lies between it and the `zero` ablation.

As fast as possible with `realtime=False` (`paced=False`: the clock is moved by the device,
exactly one window per stimulation); on the wall clock with `realtime=True` (its default is the device's:
bridge/wire/settings.py).
Feedback is accepted and ignored (a channel has nothing to learn).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from spikeloop.bridge.device.backends.base import Backend
from spikeloop.bridge.wire.channels import N_ENCODING, N_SPIKE_GROUPS, STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ
from spikeloop.bridge.wire.protocol import FeedbackCommand

if N_ENCODING != N_SPIKE_GROUPS:  # the channel maps electrode j onto group j
    raise ImportError("the transparent channel needs as many spike groups as encoding electrodes")

TRANSPARENT_MAX_COUNT = 10.0
"""Counts of a group whose electrode got the strongest stimulation in range."""


def transparent_counts(frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> np.ndarray:
    """The perfect channel's reply [N_SPIKE_GROUPS] to one stimulation (group j <- encoding electrode j)."""

    def unit(values: Sequence[float], span: tuple[float, float]) -> np.ndarray:
        low, high = span
        return np.clip((np.asarray(values, dtype=np.float64) - low) / (high - low), 0.0, 1.0)

    both = unit(frequencies_hz, STIM_FREQUENCY_RANGE_HZ) + unit(amplitudes_ua, STIM_AMPLITUDE_RANGE_UA)
    return TRANSPARENT_MAX_COUNT * both / 2.0


class TransparentBackend(Backend):
    """Replies with `transparent_counts` of the last stimulation."""

    name = "transparent"

    def __init__(self, tick_frequency_hz: float, realtime: bool) -> None:
        super().__init__(tick_frequency_hz)
        self.paced = realtime
        self._clock_s = 0.0
        self._t0 = time.monotonic()
        self._counts = np.zeros(N_SPIKE_GROUPS)

    def now_s(self) -> float:
        """Wall time since start (real time) or the device-driven clock (as fast as possible)."""
        return time.monotonic() - self._t0 if self.paced else self._clock_s

    def advance_to(self, t_s: float) -> None:
        """As fast as possible: the clock jumps to `t_s`."""
        if not self.paced:
            self._clock_s = max(self._clock_s, t_s)

    def stimulate(self, at_s: float, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """Remember the answer to this stimulation."""
        self._counts = transparent_counts(frequencies_hz, amplitudes_ua)

    def feedback(self, at_s: float, command: FeedbackCommand) -> None:
        """A channel learns nothing: feedback is ignored."""

    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """The answer to the last stimulation, whatever the window."""
        return self._counts.copy()
