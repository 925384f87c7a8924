"""The stimulation safety envelope every outgoing datagram passes.

Stimulating living tissue can harm it, so no command leaves the bridge unless it
fits the envelope. A violating command is either clamped into the envelope (and
counted) or rejected with `SafetyViolation`, as the caller chooses. NaN and inf
are always rejected: there is no sensible value to clamp them to.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from bridge.channels import ENCODING_ELECTRODES, FORBIDDEN_ELECTRODES, N_ELECTRODES, PHASE_WIDTH_US
from bridge.protocol import FeedbackCommand, FeedbackType, StimCommand, to_f32

Policy = Literal["clamp", "raise"]


class SafetyViolation(ValueError):
    """A command that falls outside the safety envelope."""


def _clamp_f32(value: float, lo: float, hi: float) -> float:
    """Clamp into [lo, hi] so that the wire's float32 rounding stays inside too."""
    x = to_f32(min(max(value, lo), hi))
    if x > hi:
        x = float(np.nextafter(np.float32(x), np.float32(-np.inf)))
    if x < lo:
        x = float(np.nextafter(np.float32(x), np.float32(np.inf)))
    return x


@dataclass(frozen=True)
class SafetyEnvelope:
    """Bounds on what may be sent to a culture.

    A stimulation entry or feedback command with amplitude 0 or frequency 0 means
    "do not stimulate" and is always allowed; anything else must lie within the
    bounds. The charge limit is per phase: amplitude x phase width.
    """

    min_frequency_hz: float = 1.0
    max_frequency_hz: float = 200.0
    min_amplitude_ua: float = 0.5
    max_amplitude_ua: float = 3.0
    max_pulses: int = 200
    phase_width_us: float = PHASE_WIDTH_US
    max_charge_per_phase_nc: float = 0.36
    forbidden_electrodes: frozenset[int] = field(default=FORBIDDEN_ELECTRODES)

    def __post_init__(self) -> None:
        object.__setattr__(self, "forbidden_electrodes", frozenset(int(e) for e in self.forbidden_electrodes))
        for name in ("min_frequency_hz", "max_frequency_hz", "min_amplitude_ua", "max_amplitude_ua",
                     "phase_width_us", "max_charge_per_phase_nc"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"safety envelope {name}={v!r}: must be a finite number >= 0")
        if self.min_frequency_hz > self.max_frequency_hz:
            raise ValueError("safety envelope: min_frequency_hz is above max_frequency_hz")
        if self.min_amplitude_ua > self.max_amplitude_ua:
            raise ValueError("safety envelope: min_amplitude_ua is above max_amplitude_ua")
        if self.max_pulses < 0:
            raise ValueError("safety envelope: max_pulses must be >= 0")
        if not FORBIDDEN_ELECTRODES <= self.forbidden_electrodes:
            missing = sorted(FORBIDDEN_ELECTRODES - self.forbidden_electrodes)
            raise ValueError(
                f"safety envelope: forbidden_electrodes must include the hardware-forbidden {missing}; "
                "you may add electrodes, never remove them"
            )
        if any(not 0 <= e < N_ELECTRODES for e in self.forbidden_electrodes):
            raise ValueError("safety envelope: forbidden_electrodes must be electrode numbers 0-63")

    @property
    def max_amplitude_by_charge_ua(self) -> float:
        """Largest amplitude the charge-per-phase limit allows (uA)."""
        return self.max_charge_per_phase_nc * 1000.0 / self.phase_width_us

    @property
    def effective_max_amplitude_ua(self) -> float:
        """The tighter of the amplitude bound and the charge bound."""
        return min(self.max_amplitude_ua, self.max_amplitude_by_charge_ua)

    def describe(self) -> str:
        """A human-readable summary for preflight review."""
        return (
            f"frequency {self.min_frequency_hz:g}-{self.max_frequency_hz:g} Hz, "
            f"amplitude {self.min_amplitude_ua:g}-{self.effective_max_amplitude_ua:g} uA "
            f"(charge <= {self.max_charge_per_phase_nc:g} nC/phase at {self.phase_width_us:g} us), "
            f"pulses <= {self.max_pulses}, forbidden electrodes {sorted(self.forbidden_electrodes)}"
        )

    # --- checks ------------------------------------------------------------------

    def _pair(self, freq: float, amp: float, what: str, policy: Policy) -> tuple[float, float, int]:
        """Return (freq, amp, violations) for one stimulation site."""
        if not math.isfinite(freq) or not math.isfinite(amp):
            raise SafetyViolation(f"{what}: frequency {freq} / amplitude {amp} is not finite")
        if freq == 0.0 or amp == 0.0:
            return 0.0, 0.0, 0  # explicit "off"
        fixed_f = _clamp_f32(freq, self.min_frequency_hz, self.max_frequency_hz)
        fixed_a = _clamp_f32(amp, self.min_amplitude_ua, self.effective_max_amplitude_ua)
        # Float32 rounding alone is not a violation; leaving the bounds is.
        violations = int(not self.min_frequency_hz <= freq <= self.max_frequency_hz) + int(
            not self.min_amplitude_ua <= amp <= self.effective_max_amplitude_ua
        )
        if violations and policy == "raise":
            raise SafetyViolation(
                f"{what}: {freq:g} Hz / {amp:g} uA is outside the envelope ({self.describe()})"
            )
        return fixed_f, fixed_a, violations

    def check_stim(self, cmd: StimCommand, policy: Policy = "clamp") -> tuple[StimCommand, int]:
        """Return a stimulation command inside the envelope and how many values were fixed."""
        freqs, amps, total = [], [], 0
        for i, (f, a) in enumerate(zip(cmd.frequencies_hz, cmd.amplitudes_ua)):
            electrode = ENCODING_ELECTRODES[i]
            if not (math.isfinite(f) and math.isfinite(a)):
                raise SafetyViolation(f"stimulation entry {i}: frequency {f} / amplitude {a} is not finite")
            if electrode in self.forbidden_electrodes and (f != 0.0 or a != 0.0):
                if policy == "raise":
                    raise SafetyViolation(f"stimulation entry {i} addresses forbidden electrode {electrode}")
                freqs.append(0.0)
                amps.append(0.0)
                total += 1
                continue
            f2, a2, v = self._pair(f, a, f"stimulation entry {i} (electrode {electrode})", policy)
            freqs.append(f2)
            amps.append(a2)
            total += v
        return StimCommand(cmd.timestamp_us, tuple(freqs), tuple(amps)), total

    def check_feedback(self, cmd: FeedbackCommand, policy: Policy = "clamp") -> tuple[FeedbackCommand | None, int]:
        """Return a feedback command inside the envelope (None if nothing is left to send) and the fix count."""
        total = 0
        channels = tuple(c for c in cmd.channels if c not in self.forbidden_electrodes)
        if len(channels) != len(cmd.channels):
            bad = sorted(set(cmd.channels) & self.forbidden_electrodes)
            if policy == "raise":
                raise SafetyViolation(f"feedback {cmd.event_name!r} addresses forbidden electrodes {bad}")
            total += 1
        if cmd.feedback_type == FeedbackType.INTERRUPT:
            # Interrupts stop stimulation; their parameters are zero by definition.
            fixed = dataclasses.replace(cmd, channels=channels, frequency_hz=0, amplitude_ua=0.0, pulses=0)
            total += int((cmd.frequency_hz, cmd.amplitude_ua, cmd.pulses) != (0, 0.0, 0))
            return (fixed if channels else None), total
        f, a, v = self._pair(float(cmd.frequency_hz), cmd.amplitude_ua, f"feedback {cmd.event_name!r}", policy)
        total += v
        pulses = int(min(max(math.floor(cmd.pulses), 0), self.max_pulses))
        if pulses != cmd.pulses:
            if policy == "raise" and cmd.pulses > self.max_pulses:
                raise SafetyViolation(f"feedback {cmd.event_name!r}: {cmd.pulses} pulses exceeds {self.max_pulses}")
            total += 1
        # The wire frequency is an integer: round towards the inside of the bounds.
        freq = int(math.floor(f))
        if f and freq < self.min_frequency_hz:
            freq = int(math.ceil(self.min_frequency_hz))
        if not channels:
            return None, total
        return dataclasses.replace(cmd, channels=channels, frequency_hz=freq, amplitude_ua=a, pulses=pulses), total
