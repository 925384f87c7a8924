"""The pulse-rate ceiling across commands: no electrode is pulsed faster than `max_pulse_rate_hz`, whatever arrives.

Each command passes the envelope alone, but commands add up: a stimulation every millisecond restarts a burst on
every encoding electrode every millisecond, and a burst started beside a running one on the same electrode
interleaves with it. The device therefore books, per electrode, the burst that runs there (first pulse, interval,
pulses) and the last pulse before it, and refuses a command (whole, counted, recorded; a stimulation is still
answered) any of whose pulses would come less than `1 / max_pulse_rate_hz` after another pulse on the same electrode.
So no electrode is pulsed above the ceiling over any window: two pulses are never closer than its period.

A new burst meets a running one as the backend's hardware does: the simulated culture replaces it (the rest of the
old burst is cancelled), the CL1 SDK queues it behind the running one. A queued burst would start only when the
running one ends, so a flood would put the device behind its commands without bound: a burst that would queue is
refused instead. An interrupt cuts the running burst. Pulses at or before the moment a burst is cut count as
delivered (the safe side). The book is four numbers per electrode: its memory does not grow with what arrives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from spikeloop.bridge.device.backends.base import burst_charge_nc, stim_pulses
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, N_ELECTRODES, STIMULABLE_ELECTRODES
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, StimCommand
from spikeloop.bridge.wire.safety import SafetyViolation

EPS_S = 1e-9
"""Float slack on times (s): pulses on a whole-millisecond grid must not fail the check by rounding."""


class PulseRateRefusal(SafetyViolation):
    """A command that would pulse an electrode faster than the device's pulse-rate ceiling."""


@dataclass(frozen=True)
class Burst:
    """Pulses one command starts on one electrode: `pulses` of them from `start_s`, `interval_s` apart."""

    electrode: int
    start_s: float
    interval_s: float
    pulses: int
    pulse_nc: float = 0.0
    """Charge of one pulse in one phase polarity (the dose book's unit)."""


@dataclass(frozen=True)
class Cancelled:
    """Pulses of a burst that an interrupt or a newer burst cut off: booked at `booked_at_s`, never given."""

    electrode: int
    booked_at_s: float
    charge_nc: float


class PulseBook:
    """Per electrode: the running burst and the last pulse before it; checks and books commands against the ceiling."""

    def __init__(self, max_pulse_rate_hz: float, queues_bursts: bool) -> None:
        if isinstance(max_pulse_rate_hz, bool) or not (
            isinstance(max_pulse_rate_hz, (int, float)) and 0 < max_pulse_rate_hz < math.inf
        ):
            raise ValueError(f"max_pulse_rate_hz={max_pulse_rate_hz!r}: must be a finite number > 0")
        self.max_pulse_rate_hz = float(max_pulse_rate_hz)
        self.min_gap_s = 1.0 / self.max_pulse_rate_hz
        self.queues_bursts = queues_bursts
        """True: a new burst waits for the running one (the CL1 SDK); False: it replaces it (the simulated culture)."""
        self._start_s = [0.0] * N_ELECTRODES
        self._interval_s = [0.0] * N_ELECTRODES
        self._pulses = [0] * N_ELECTRODES  # of the running (or last) burst; 0: none
        self._before_s = [-math.inf] * N_ELECTRODES  # the last pulse before that burst
        self._pulse_nc = [0.0] * N_ELECTRODES  # that burst's charge per pulse
        self._booked_at_s = [0.0] * N_ELECTRODES  # when the dose book booked it (whole)

    def _given(self, electrode: int, t_s: float) -> int:
        """How many pulses of the burst on `electrode` come at or before `t_s`."""
        start, pulses = self._start_s[electrode], self._pulses[electrode]
        if pulses == 0 or start > t_s + EPS_S:
            return 0
        interval = self._interval_s[electrode]
        return pulses if interval <= 0 else min(pulses, max(0, math.floor((t_s - start) / interval + EPS_S)) + 1)

    def _last_pulse_s(self, electrode: int, t_s: float) -> float:
        """The last pulse on `electrode` at or before `t_s` (-inf: none)."""
        given = self._given(electrode, t_s)
        if given == 0:
            return self._before_s[electrode]
        return self._start_s[electrode] + (given - 1) * self._interval_s[electrode]

    def busy_until_s(self, electrode: int) -> float:
        """The last pulse the running burst on `electrode` will give (-inf: none running)."""
        if self._pulses[electrode] == 0:
            return self._before_s[electrode]
        return self._start_s[electrode] + (self._pulses[electrode] - 1) * self._interval_s[electrode]

    def plan(self, at_s: float, bursts: list[Burst], interrupted: Iterable[int], what: str) -> float:
        """How much later than `at_s` the command must start (0, or less than one ceiling period) so that none of its
        pulses comes closer than the period to another on its electrode; raise PulseRateRefusal if no such delay.

        `bursts` start at `at_s`; `interrupted`: electrodes the command interrupts before its bursts start. A delay
        is needed when a burst was just cut (an interrupt before negative feedback, a burst replaced) a pulse
        before: the new one then starts one period after that pulse, as the CL1 SDK starts a burst on a channel
        that has just pulsed.
        """
        cut = set(interrupted)
        for burst in bursts:
            e = burst.electrode
            if burst.pulses > 1 and burst.interval_s < self.min_gap_s - EPS_S:
                raise PulseRateRefusal(
                    f"{what} would pulse electrode {e} every {burst.interval_s * 1e3:.3g} ms, faster than the "
                    f"device's pulse-rate ceiling of {self.max_pulse_rate_hz:g} Hz"
                )
            if self.queues_bursts and e not in cut and self.busy_until_s(e) > at_s + EPS_S:
                raise PulseRateRefusal(
                    f"{what} would start a burst on electrode {e} while its last one runs until "
                    f"{self.busy_until_s(e):.3f} s (now {at_s:.3f} s): the device would queue it behind, and a "
                    "stream of such commands would put it behind without bound; interrupt first, or wait"
                )
        delay_s = 0.0
        for _ in range(3):  # a later start may meet a later pulse of a burst it replaces: settle in a few rounds
            needed_s = delay_s
            for burst in bursts:
                # What ran there (replaced, or cut by this command's interrupt) pulses until the command applies.
                last_s = self._last_pulse_s(burst.electrode, burst.start_s + delay_s)
                needed_s = max(needed_s, last_s + self.min_gap_s - burst.start_s)
            if needed_s <= delay_s + EPS_S:
                return delay_s
            if needed_s > self.min_gap_s + EPS_S:
                break
            delay_s = needed_s
        raise PulseRateRefusal(
            f"{what} would pulse an electrode less than {self.min_gap_s * 1e3:.3g} ms after another pulse there "
            f"(the device's pulse-rate ceiling of {self.max_pulse_rate_hz:g} Hz), and a burst running there leaves "
            "no gap to start in"
        )

    def _cut(self, e: int, at_s: float) -> Cancelled | None:
        """End the burst on `e` at `at_s` (pulses up to it count as given); what it would still have given."""
        pulses = self._pulses[e]
        if pulses == 0:
            return None
        given = self._given(e, at_s)
        self._before_s[e] = self._last_pulse_s(e, at_s)
        self._pulses[e] = 0
        if given == pulses:
            return None
        return Cancelled(e, self._booked_at_s[e], (pulses - given) * self._pulse_nc[e])

    def interrupt(self, at_s: float, electrodes: Iterable[int]) -> list[Cancelled]:
        """Cut the running burst on each electrode: its pulses after `at_s` are not given."""
        return [c for e in electrodes if (c := self._cut(e, at_s)) is not None]

    def deliver(self, at_s: float, bursts: Iterable[Burst], interrupted: Iterable[int]) -> list[Cancelled]:
        """Book a command that passed `plan`, applied at `at_s`: its interrupts, then its bursts (each replacing what
        ran before: a CL1's queue never gets here, `plan` refuses it). Returns the pulses cut off, for the dose."""
        cancelled = self.interrupt(at_s, interrupted)
        for burst in bursts:
            e = burst.electrode
            if (c := self._cut(e, at_s)) is not None:
                cancelled.append(c)
            self._start_s[e] = burst.start_s
            self._interval_s[e] = burst.interval_s
            self._pulses[e] = burst.pulses
            self._pulse_nc[e] = burst.pulse_nc
            self._booked_at_s[e] = at_s
        return cancelled


class BurstTiming(Protocol):
    def __call__(self, at_s: float, frequency_hz: float) -> tuple[float, float]: ...


def stim_bursts(
    cmd: StimCommand, at_s: float, timing: BurstTiming, tick_frequency_hz: float, stim_mode: str
) -> tuple[list[Burst], tuple[int, ...]]:
    """The bursts one stimulation command starts and the electrodes it interrupts first (`stim_mode` as applied)."""
    bursts = []
    for electrode, freq, amp in zip(ENCODING_ELECTRODES, cmd.frequencies_hz, cmd.amplitudes_ua):
        pulses = stim_pulses(freq, tick_frequency_hz, stim_mode) if freq > 0 and amp > 0 else 0
        if pulses > 0:
            bursts.append(Burst(electrode, *timing(at_s, freq), pulses, burst_charge_nc(amp, 1)))
    return bursts, STIMULABLE_ELECTRODES if stim_mode == "reference" else ()


def feedback_bursts(cmd: FeedbackCommand, at_s: float, timing: BurstTiming) -> tuple[list[Burst], tuple[int, ...]]:
    """The bursts one feedback command starts (one per listed channel) and the electrodes it interrupts."""
    channels = tuple(dict.fromkeys(cmd.channels))  # a channel listed twice is one burst there
    if cmd.feedback_type == FeedbackType.INTERRUPT:
        return [], channels
    if not (cmd.frequency_hz > 0 and cmd.amplitude_ua > 0 and cmd.pulses >= 1):
        return [], ()
    start_s, interval_s = timing(at_s, cmd.frequency_hz)
    pulse_nc = burst_charge_nc(cmd.amplitude_ua, 1)
    return [Burst(e, start_s, interval_s, int(cmd.pulses), pulse_nc) for e in channels], ()
