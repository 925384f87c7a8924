"""A plain device's own clock, learnt against our send times: which stimulation can a reply answer?

A device without echo stamps each reply with its own clock when it sends it.
That stamp is useless on its own (another clock, another offset, its own
drift), but against our send times it is not: for every answer the bridge was
sure of, `x = stamp - send time` is the clocks' offset plus how long the device
took to answer. Over recent answers `x` follows a line (the offset, drifting
slowly) within a narrow band (the device's reply timing). A new reply then
fits a stimulation j only if its stamp, read against j's send time, lies in
j's window: no sooner than the device has ever answered (the band's low edge),
and no later than the horizon (protocol v1's promise: a reply comes within
`timeout + late_grace` or never). A reply
held up on its way (a queue, a network) keeps the stamp it left with, so it
still names its own stimulation however late it arrives.

A device that stalls stamps late too, and that the stamp cannot tell from a
slow answer to a later stimulation; the bridge therefore takes a reply stamped
later than the device usually answers (`on_time` False) only while no recent
stimulation is still unanswered, and after a recent unanswered one it listens
`settle_s` longer for a second reply (a stalled device sends both back to
back): two mean one of them is the stalled one, and neither is taken.

The clock is only used once it has shown that it runs at our rate: a constant,
backward or stepping clock leaves residuals as wide as the time the samples
span, and its stamps do not move as far as the send times between the first
and last answers (which catches answers bunched in time, whose quantile band
stays narrow), so it is never `ready` (the bridge then falls back on arrival
order alone).
Once learnt, it is kept until the bridge `forget`s it (replies stopped fitting).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

SAMPLES = 64
"""Answers the model is fitted on (the most recent)."""
MIN_SAMPLES = 4
"""Answers needed before stamps decide anything."""
MAX_DRIFT = 500e-6
"""Largest clock drift fitted (crystal oscillators drift well under 100 ppm); steeper slopes are noise or a broken
clock, and the residuals then show it."""
SPREAD_SHARE = 0.25
"""The clock runs at our rate if the residuals spread over at most this share of the time the samples span."""
BAND_QUANTILE = 0.05
"""The band is cut at this quantile on each side, so that one wrong sample cannot widen it."""
MIN_SLACK_S = 0.002
"""Tolerance on every window edge, at least (scheduling jitter on the trainer's side)."""
ON_TIME_SHARE = 0.25
"""A reply stamped up to this share of the timeout later than the band is still on time (a busy machine)."""
SOONER_SHARE = 0.25
"""A reply stamped up to this share of the timeout sooner than the band still fits. A device that answers on its own
ticks answers up to a tick sooner when a stimulation reaches it late in a tick, and a loop locked to those ticks never
shows the band that: every reply comes a whole tick after the last (docs/benchmarks.md, "loop")."""


@dataclass(frozen=True)
class ClockFit:
    """The learnt relation between the device's stamps and our send times (seconds)."""

    t_mid: float
    offset_s: float
    """Stamp minus send time, typical, at `t_mid`: the clocks' offset plus the device's usual reply time."""
    drift: float
    """How fast that offset changes per second of our clock (the device clock's rate error)."""
    band_lo_s: float
    band_hi_s: float
    """The residuals' band: how much sooner or later than usual the device answers."""
    slack_s: float
    """Tolerance added to every window edge."""

    def residual(self, stamp_us: int, t_sent: float) -> float:
        """How much later than usual this stamp is, if it answers the stimulation sent at `t_sent`."""
        return stamp_us / 1e6 - t_sent - (self.offset_s + self.drift * (t_sent - self.t_mid))


class ReplyClock:
    """Learns a plain device's clock from the answers the bridge was sure of; tells which stimulations a reply fits."""

    def __init__(self, timeout_s: float, horizon_s: float) -> None:
        self.timeout_s = timeout_s
        self.horizon_s = horizon_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=SAMPLES)
        self._fit: ClockFit | None = None
        self._observed = 0  # answers observed since the clock was last forgotten

    @property
    def fit(self) -> ClockFit | None:
        """The current fit, or None while the clock cannot be trusted (too few answers, or not running at our rate)."""
        return self._fit

    @property
    def ready(self) -> bool:
        """True when stamps decide attribution."""
        return self._fit is not None

    @property
    def learning(self) -> bool:
        """True while the clock is not ready but may still become so (fewer than `SAMPLES` answers observed).

        A clock not ready after `SAMPLES` answers (constant, backward, or not at our rate) is given up on:
        arrival order then decides, as protocol v1 promises it may.
        """
        return self._fit is None and self._observed < SAMPLES

    @property
    def margin_s(self) -> float:
        """How long past a written-off stimulation's horizon the next one must wait so that their windows part."""
        fit = self._fit
        return 0.0 if fit is None else 2 * fit.slack_s + self.sooner_s + max(0.0, -fit.band_lo_s)

    def observe(self, t_sent: float, stamp_us: int) -> None:
        """One answer the bridge is sure of: the stimulation's send time (perf_counter s) and the reply's stamp."""
        self._samples.append((t_sent, stamp_us))
        self._observed += 1
        if len(self._samples) >= MIN_SAMPLES:
            # Once learnt, a clock is kept through a spell of jitter; `forget` drops it when replies stop fitting.
            self._fit = self._refit() or self._fit

    def forget(self) -> None:
        """Drop everything learnt (the device clock stepped, or another device program answers)."""
        self._samples.clear()
        self._fit = None
        self._observed = 0

    def fits(self, stamp_us: int, t_sent: float) -> bool:
        """Could a reply stamped `stamp_us` answer the stimulation sent at `t_sent`?"""
        fit = self._fit
        if fit is None:
            raise RuntimeError("ReplyClock.fits before the clock is ready")
        r = fit.residual(stamp_us, t_sent)
        # Made no sooner after the stimulation than the device answers (within SOONER_SHARE of the timeout), and no
        # later than the horizon.
        return fit.band_lo_s - fit.slack_s - self.sooner_s <= r <= self.horizon_s + fit.slack_s

    @property
    def sooner_s(self) -> float:
        """How much sooner than the band a reply may be stamped and still fit."""
        return SOONER_SHARE * self.timeout_s

    def on_time(self, stamp_us: int, t_sent: float) -> bool:
        """Is the reply stamped within the device's usual reply time after the stimulation sent at `t_sent`?"""
        fit = self._fit
        late_by = max(fit.slack_s, ON_TIME_SHARE * self.timeout_s) if fit is not None else 0.0
        return fit is not None and fit.residual(stamp_us, t_sent) <= fit.band_hi_s + late_by

    @property
    def settle_s(self) -> float:
        """How soon after one reply the next is sent by a device that answers two stimulations back to back."""
        fit = self._fit
        return 0.0 if fit is None else fit.band_hi_s - fit.band_lo_s + 2 * fit.slack_s

    def describe(self) -> dict[str, float | bool | int]:
        """For stats: whether stamps decide, and the fit."""
        fit = self._fit
        if fit is None:
            return {"ready": False, "samples": len(self._samples), "learning": self.learning}
        return {
            "ready": True,
            "samples": len(self._samples),
            "drift_ppm": fit.drift * 1e6,
            "band_ms": (fit.band_hi_s - fit.band_lo_s) * 1000,
            "slack_ms": fit.slack_s * 1000,
        }

    def _refit(self) -> ClockFit | None:
        t = np.array([s[0] for s in self._samples])
        # Relative to the first stamp, so that float64 keeps microseconds.
        base_us = self._samples[0][1]
        x = np.array([(s[1] - base_us) / 1e6 for s in self._samples]) - t
        t_mid = float(np.median(t))
        span = float(t.max() - t.min())
        if span <= 0:
            return None
        dt = t - t_mid
        sum_dt2 = max(float(np.dot(dt, dt)), 1e-12)
        slope = float(np.dot(dt, x - x.mean())) / sum_dt2
        # Over a short span the reply jitter swamps any real drift: a slope within twice its standard error is noise.
        slope_se = float(np.std(x - x.mean() - slope * dt)) / np.sqrt(sum_dt2)
        drift = float(np.clip(slope, -MAX_DRIFT, MAX_DRIFT)) if abs(slope) > 2 * slope_se else 0.0
        level = x - drift * dt
        offset = float(np.median(level))
        residuals = level - offset
        lo, hi = (float(q) for q in np.quantile(residuals, [BAND_QUANTILE, 1 - BAND_QUANTILE]))
        spread = hi - lo
        slack = max(MIN_SLACK_S, spread / 2)
        # A clock that does not run at our rate, or is coarser than the horizon, decides nothing. Nor does one whose
        # stamps did not move as far as our clock between the first and last answers: answers bunched in time (a fast
        # loop, then a long wait) keep the quantile band narrow even for a constant clock.
        (t_first, stamp_first), (t_last, stamp_last) = self._samples[0], self._samples[-1]
        behind_s = (t_last - t_first) - (stamp_last - stamp_first) / 1e6
        if spread > SPREAD_SHARE * span or spread > self.horizon_s or abs(behind_s) > SPREAD_SHARE * span:
            return None
        return ClockFit(t_mid, offset + base_us / 1e6, drift, lo, hi, slack)
