"""The `sim` backend: the simulated culture (`spikeloop.bridge.device.simulated_culture`) behind the device.

Real time: culture time is pinned to the monotonic clock; the device calls
`advance_to` as wall time passes and the culture catches up in chunks.
As fast as possible: culture time only moves when the device advances it,
which it does by exactly the artifact and collection windows per stimulation.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np

from spikeloop.bridge.device.backends.base import Backend, group_matrix, stim_pulses
from spikeloop.bridge.device.culture_state import device_culture, save_culture
from spikeloop.bridge.device.simulated_culture import DT_MS, SimulatedCultureConfig
from spikeloop.bridge.wire.channels import (
    ENCODING_ELECTRODES,
    FORBIDDEN_ELECTRODES,
    N_ELECTRODES,
    STIMULABLE_ELECTRODES,
)
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType
from spikeloop.bridge.wire.settings import CULTURE_SEED, CULTURE_STATE, STIM_MODE

log = logging.getLogger(__name__)

HISTORY_STEPS = 1 << 15
"""Per-millisecond electrode counts kept for window sums (~33 s of culture time)."""


class SimBackend(Backend):
    """A seeded simulated culture, in real time or as fast as possible."""

    name = "sim"

    def __init__(
        self,
        tick_frequency_hz: float,
        seed: int,
        realtime: bool,
        culture_config: SimulatedCultureConfig | None = None,
        stim_mode: str = STIM_MODE.default,
        culture_seed: int | None = CULTURE_SEED.default,
        culture_fixed: Collection[str] = (),
        culture_state: Path | None = CULTURE_STATE.default,
    ) -> None:
        super().__init__(tick_frequency_hz)
        stim_pulses(1.0, tick_frequency_hz, stim_mode)  # refuses an unknown mode here, not at the first stimulation
        self.stim_mode = stim_mode
        """`burst` or `reference` (spikeloop.bridge.device.backends.base.STIM_MODES)."""
        self.paced = realtime
        self.culture = device_culture(culture_config, seed, culture_seed, culture_fixed, culture_state)
        self.culture_state = culture_state
        """Where the culture is saved when the backend closes (None: nowhere)."""
        self._history = np.zeros((HISTORY_STEPS, N_ELECTRODES), dtype=np.int32)
        self._groups = group_matrix()
        self._t0 = time.monotonic()
        self.skipped_forbidden = 0

    def close(self) -> None:
        """Close the recording, then save the culture to `culture_state` (a later program continues it)."""
        super().close()
        if self.culture_state is not None:
            try:
                save_culture(self.culture, self.culture_state)
            except OSError as exc:
                log.error("culture state NOT saved to %s: %s", self.culture_state, exc)
            else:
                log.info("culture saved to %s at culture time %.3f s", self.culture_state, self.culture.time_ms / 1e3)

    def open(self, recording_dir: Path | None) -> None:
        """Warm the kernel up (compile) so the first reply is not late, then pin the clock."""
        super().open(recording_dir)
        self.culture.advance(0)
        self._t0 = time.monotonic() - self.culture.time_ms / 1000.0

    def now_s(self) -> float:
        """Wall time since open (real time) or culture time (as fast as possible)."""
        if self.paced:
            return time.monotonic() - self._t0
        return self.culture.time_ms / 1000.0

    def stimulate(self, at_s: float, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """Pulses on each encoding electrode as `stim_mode` says (off, ending any burst there, unless both > 0).

        `burst`: a burst lasting one hardware tick; `reference`: every stimulable electrode interrupted, then
        one pulse per encoding electrode.
        """
        if self.stim_mode == "reference":
            for electrode in STIMULABLE_ELECTRODES:
                self.culture.interrupt(electrode)
        for electrode, freq, amp in zip(ENCODING_ELECTRODES, frequencies_hz, amplitudes_ua, strict=True):
            if freq > 0 and amp > 0:
                pulses = stim_pulses(freq, self.tick_frequency_hz, self.stim_mode)
                self.culture.stimulate(electrode, amp, pulses, freq, start_ms=at_s * 1000.0)
            else:
                self.culture.stimulate(electrode, 0.0, 0, 0.0, start_ms=at_s * 1000.0)

    def feedback(self, at_s: float, command: FeedbackCommand) -> None:
        """Burst (pulses at frequency and amplitude) or interrupt on the listed channels."""
        for channel in command.channels:
            if channel in FORBIDDEN_ELECTRODES:
                # The trainer's envelope should never let this through; a device defends too.
                self.skipped_forbidden += 1
                continue
            if command.feedback_type == FeedbackType.INTERRUPT:
                self.culture.interrupt(channel)
            elif command.frequency_hz > 0 and command.amplitude_ua > 0 and command.pulses >= 1:
                self.culture.stimulate(
                    channel, command.amplitude_ua, int(command.pulses), command.frequency_hz, start_ms=at_s * 1000.0
                )

    def burst_timing(self, at_s: float, frequency_hz: float) -> tuple[float, float]:
        """The culture pulses on whole milliseconds: its own start and interval, not `at_s` and 1 / frequency."""
        start_ms = math.ceil(at_s * 1000.0 / DT_MS - 1e-9) * DT_MS
        interval_ms = max(1, round(1000.0 / frequency_hz / DT_MS)) * DT_MS
        return start_ms / 1000.0, interval_ms / 1000.0

    def advance_to(self, t_s: float) -> None:
        """Simulate up to `t_s`, keeping per-millisecond electrode counts."""
        target_step = int(math.ceil(t_s * 1000.0 / DT_MS - 1e-9))
        while self.culture.step < target_step:
            first = self.culture.step
            n = min(target_step - first, HISTORY_STEPS // 2)
            counts = self.culture.advance(n * DT_MS)
            idx = (first + np.arange(n)) % HISTORY_STEPS
            self._history[idx] = counts

    def available_until_s(self) -> float:
        """Culture time simulated so far."""
        return self.culture.time_ms / 1000.0

    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """Sum of the kept per-millisecond counts in the window, per group."""
        first = int(math.ceil(start_s * 1000.0 / DT_MS - 1e-9))
        last = int(math.ceil(end_s * 1000.0 / DT_MS - 1e-9))
        first = max(first, self.culture.step - HISTORY_STEPS)
        if last <= first:
            return np.zeros(self._groups.shape[1])
        idx = np.arange(first, last) % HISTORY_STEPS
        return self._history[idx].sum(axis=0) @ self._groups
