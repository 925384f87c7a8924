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

from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, FORBIDDEN_ELECTRODES, N_ELECTRODES, PHASE_WIDTH_US
from spikeloop.bridge.wire.protocol import U32_MAX, FeedbackCommand, FeedbackType, StimCommand, to_f32

Policy = Literal["clamp", "raise"]
F32_MAX = float(np.finfo(np.float32).max)

# The hard physical ceiling: no envelope (an experiment's `safety`, a device's flags) may go above these, so
# nothing above them is ever sent or applied. They are the stimulation limits the CL1 SDK documents: at most
# 3 uA and 3 nC per phase, bursts up to 200 Hz; the never-stimulated channels 0, 7, 56 and 63 are part of
# FORBIDDEN_ELECTRODES (bridge/wire/channels.py). An envelope narrows them; nothing widens them.
CEILING_MAX_AMPLITUDE_UA = 3.0
CEILING_MAX_CHARGE_PER_PHASE_NC = 3.0
CEILING_MAX_FREQUENCY_HZ = 200.0
CEILINGS = {
    "max_amplitude_ua": (CEILING_MAX_AMPLITUDE_UA, "uA"),
    "max_charge_per_phase_nc": (CEILING_MAX_CHARGE_PER_PHASE_NC, "nC"),
    "max_frequency_hz": (CEILING_MAX_FREQUENCY_HZ, "Hz"),
}
"""Envelope field -> (hard ceiling, unit)."""


class SafetyViolation(ValueError):
    """A command that falls outside the safety envelope."""


def _f32_at_least(value: float) -> float:
    """The smallest float32 >= value (inf beyond float32's range)."""
    if abs(value) > F32_MAX:
        return math.copysign(math.inf, value)
    x = to_f32(value)
    return float(np.nextafter(np.float32(x), np.float32(np.inf))) if x < value else x


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
    max_frequency_hz: float = CEILING_MAX_FREQUENCY_HZ
    min_amplitude_ua: float = 0.5
    max_amplitude_ua: float = CEILING_MAX_AMPLITUDE_UA
    max_pulses: int = 200
    phase_width_us: float = PHASE_WIDTH_US
    max_charge_per_phase_nc: float = 0.36
    forbidden_electrodes: frozenset[int] = field(default=FORBIDDEN_ELECTRODES)

    def __post_init__(self) -> None:
        object.__setattr__(self, "forbidden_electrodes", frozenset(int(e) for e in self.forbidden_electrodes))
        for name in (
            "min_frequency_hz",
            "max_frequency_hz",
            "min_amplitude_ua",
            "max_amplitude_ua",
            "phase_width_us",
            "max_charge_per_phase_nc",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name}={v!r}: must be a finite number > 0")
        pulses: object = self.max_pulses  # checked here: YAML may give any type
        if isinstance(pulses, float) and pulses.is_integer():
            pulses = int(pulses)
        if isinstance(pulses, bool) or not isinstance(pulses, int) or not 0 <= pulses <= U32_MAX:
            raise ValueError(f"max_pulses={self.max_pulses!r}: must be a whole number 0-{U32_MAX}")
        object.__setattr__(self, "max_pulses", pulses)
        for name, (ceiling, unit) in CEILINGS.items():
            if getattr(self, name) > ceiling:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: above the hard ceiling of {ceiling:g} {unit} (the CL1 SDK's "
                    f"documented stimulation limit; no envelope may exceed it); set {ceiling:g} or less"
                )
        if self.min_frequency_hz > self.max_frequency_hz:
            raise ValueError(
                f"min_frequency_hz={self.min_frequency_hz:g} is above max_frequency_hz={self.max_frequency_hz:g}"
            )
        if self.max_frequency_hz > U32_MAX:
            raise ValueError(
                f"max_frequency_hz={self.max_frequency_hz:g}: the feedback wire carries at most {U32_MAX} Hz"
            )
        if math.ceil(self.min_frequency_hz) > math.floor(self.max_frequency_hz):
            raise ValueError(
                f"min_frequency_hz={self.min_frequency_hz:g} .. max_frequency_hz={self.max_frequency_hz:g}: feedback "
                "frequencies travel as whole Hz and none lies in this range; widen it to include a whole number"
            )
        if self.min_amplitude_ua > self.max_amplitude_ua:
            raise ValueError(
                f"min_amplitude_ua={self.min_amplitude_ua:g} is above max_amplitude_ua={self.max_amplitude_ua:g}"
            )
        if self.effective_max_amplitude_ua < self.min_amplitude_ua:
            raise ValueError(
                f"max_charge_per_phase_nc={self.max_charge_per_phase_nc:g} allows at most "
                f"{self.max_amplitude_by_charge_ua:g} uA at {self.phase_width_us:g} us per phase, below "
                f"min_amplitude_ua={self.min_amplitude_ua:g}; raise the charge limit or lower the minimum amplitude"
            )
        for lo_name, lo, hi_name, hi in (
            ("min_frequency_hz", self.min_frequency_hz, "max_frequency_hz", self.max_frequency_hz),
            ("min_amplitude_ua", self.min_amplitude_ua, "max_amplitude_ua", self.effective_max_amplitude_ua),
        ):
            if _f32_at_least(lo) > hi:
                raise ValueError(
                    f"{lo_name}={lo!r} .. {hi_name}={hi!r}: no 32-bit float (what the wire carries) "
                    "lies in this range; widen it"
                )
        if not FORBIDDEN_ELECTRODES <= self.forbidden_electrodes:
            missing = sorted(FORBIDDEN_ELECTRODES - self.forbidden_electrodes)
            raise ValueError(
                f"forbidden_electrodes must include the hardware-forbidden {missing}; "
                "you may add electrodes, never remove them"
            )
        if any(not 0 <= e < N_ELECTRODES for e in self.forbidden_electrodes):
            raise ValueError("forbidden_electrodes must be electrode numbers 0-63")

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
        """Return (freq, amp, violations) for one stimulation site; (0, 0) means off."""
        if not math.isfinite(freq) or not math.isfinite(amp):
            raise SafetyViolation(f"{what}: frequency {freq} / amplitude {amp} is not finite")
        if freq == 0.0 or amp == 0.0:
            return 0.0, 0.0, 0  # explicit "off"
        if freq < 0.0 or amp < 0.0:
            # No sign convention exists on the wire: a negative value is a bug upstream, and the safe reading is off.
            if policy == "raise":
                raise SafetyViolation(f"{what}: {freq:g} Hz / {amp:g} uA is negative")
            return 0.0, 0.0, 1
        fixed_f = _clamp_f32(freq, self.min_frequency_hz, self.max_frequency_hz)
        fixed_a = _clamp_f32(amp, self.min_amplitude_ua, self.effective_max_amplitude_ua)
        # Float32 rounding alone is not a violation; leaving the bounds is.
        violations = int(not self.min_frequency_hz <= freq <= self.max_frequency_hz) + int(
            not self.min_amplitude_ua <= amp <= self.effective_max_amplitude_ua
        )
        if violations and policy == "raise":
            raise SafetyViolation(f"{what}: {freq:g} Hz / {amp:g} uA is outside the envelope ({self.describe()})")
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
        """Return a feedback command inside the envelope (None if nothing is left to send) and the fix count.

        A burst with no pulses, no frequency or no amplitude stimulates nothing and is not sent.
        """
        total = 0
        try:
            # The constructor checks these, but an object that skipped it (unpickled, say) must not slip by.
            feedback_type = FeedbackType(cmd.feedback_type)
            allowed = [
                not isinstance(c, bool)
                and isinstance(c, int)
                and 0 <= c < N_ELECTRODES
                and c not in self.forbidden_electrodes
                for c in cmd.channels
            ]
        except (TypeError, ValueError):
            raise SafetyViolation(f"feedback {cmd.event_name!r}: not a well-formed feedback command") from None
        channels = tuple(c for c, ok in zip(cmd.channels, allowed) if ok)
        if len(channels) != len(cmd.channels):
            bad = sorted({repr(c) for c, ok in zip(cmd.channels, allowed) if not ok})
            if policy == "raise":
                raise SafetyViolation(f"feedback {cmd.event_name!r} addresses forbidden electrodes [{', '.join(bad)}]")
            total += 1
        if feedback_type == FeedbackType.INTERRUPT:
            # Interrupts stop stimulation; their parameters are zero by definition.
            fixed = dataclasses.replace(cmd, channels=channels, frequency_hz=0, amplitude_ua=0.0, pulses=0)
            total += int((cmd.frequency_hz, cmd.amplitude_ua, cmd.pulses) != (0, 0.0, 0))
            return (fixed if channels else None), total
        f, a, v = self._pair(float(cmd.frequency_hz), float(cmd.amplitude_ua), f"feedback {cmd.event_name!r}", policy)
        total += v
        requested = float(cmd.pulses)
        if not math.isfinite(requested):
            raise SafetyViolation(f"feedback {cmd.event_name!r}: {requested} pulses is not finite")
        if policy == "raise" and not 0 <= requested <= self.max_pulses:
            raise SafetyViolation(f"feedback {cmd.event_name!r}: {requested:g} pulses is outside 0-{self.max_pulses}")
        pulses = int(min(max(math.floor(requested), 0), self.max_pulses))
        total += int(pulses != requested)
        # The wire frequency is a whole number: round towards the inside of the bounds (the envelope
        # guarantees a whole number lies inside).
        freq = int(math.floor(f))
        if f and freq < self.min_frequency_hz:
            freq = int(math.ceil(self.min_frequency_hz))
        if not channels or freq == 0 or a == 0.0 or pulses == 0:
            return None, total  # nothing to stimulate
        return dataclasses.replace(cmd, channels=channels, frequency_hz=freq, amplitude_ua=a, pulses=pulses), total
