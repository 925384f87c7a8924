"""Does each reply answer the stimulation it is taken for? Correlations at a few lags tell.

Protocol v1 promises one reply per stimulation, carrying the spikes counted in
the windows after *that* stimulation (artifact wait, then collection window).
Timestamps cannot prove it: a device that applies each stimulation only after
the tick it reports echoes every stamp correctly and still answers stimulation
n with the culture's response to stimulation n-1. Only the counts can show it.

So each stimulation is reduced to one number, its drive (`stim_drive`), each
reply to its total count, and correlations are kept over the same replies:
`r_current` (lag 0), the counts against the stimulation they answer, and
`r_previous` (lag 1), against the stimulation before it, and so on up to
`MAX_LAG`. A device that answers in time shows |r_current| above the others
(once the culture responds at all); a device one stimulation late shows
|r_previous| above |r_current|. A device whose counts carry no stimulus (the
`zero` and `random` ablations, a culture that does not respond at the level
used) shows nothing significant at any lag, and is not late: `assess` decides
with every lag's correlation and its significance for the number of replies.

`CausalityMeter` keeps running sums only (13 floats, updated per reply):
unweighted for `spikeloop check`'s probe, exponentially weighted over a window
of stimulations during training. Significance uses Fisher's z transform (normal
approximation, stdlib only: the device side imports neither scipy nor Ray).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

ALPHA = 0.001
"""Significance level of every test here: a check that fails a lab's device must not do so by chance."""
MAX_LAG = 2
"""Lags tested: a device that takes a stimulation on its next hardware tick and reports the tick before may answer
with the counts of the stimulation before (lag 1) or, depending on where the trainer falls between its ticks, the
one before that (lag 2)."""
MIN_PAIRS = 10
"""Fewer replies than this decide nothing (`too_few`)."""
CONSTANT_SHARE = 1e-9
"""A variance below this share of the mean square is taken as zero (the counts or the drive are constant)."""

Verdict = Literal["current", "late", "mixed", "none", "constant_counts", "constant_stim", "too_few"]
"""`current`: the counts follow the stimulation they answer; `late`: they follow an earlier one (the device answers
`Causality.late_by` stimulations late); `mixed`: an earlier one significantly, but not clearly more than the
one answered, nor less (a response that outlasts an exchange, a device that mixes windows); `none`: no lag
significantly (no stimulus in the counts: an ablation, or a
culture that does not respond at this level); `constant_counts` / `constant_stim`: one side never varies, nothing to
correlate; `too_few`: fewer than MIN_PAIRS replies."""


def stim_drive(frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> float:
    """How hard one stimulation drives the culture, as one number: the sum over electrodes of Hz x uA."""
    return float(sum(f * a for f, a in zip(frequencies_hz, amplitudes_ua, strict=True)))


def _p_two_sided(r: float, n: float) -> float:
    """P(|r| at least this large | no correlation), Fisher's z with n pairs."""
    if not math.isfinite(r) or n <= 3:
        return 1.0
    z = math.atanh(min(abs(r), 1 - 1e-12)) * math.sqrt(n - 3)
    return math.erfc(z / math.sqrt(2))


def _p_greater(r_big: float, r_small: float, n: float) -> float:
    """P(|r_big| exceeds |r_small| by this much | equal strength), one-sided, the two taken as independent.

    Independent is what the probe's pseudo-random pattern makes them: successive stimulations are uncorrelated.
    """
    if not (math.isfinite(r_big) and math.isfinite(r_small)) or n <= 3:
        return 1.0
    z_big, z_small = (math.atanh(min(abs(r), 1 - 1e-12)) for r in (r_big, r_small))
    z = (z_big - z_small) / math.sqrt(2.0 / (n - 3))
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class Causality:
    """What the replies so far say about which stimulation they answer."""

    n: float
    """Replies counted (the effective number, when weighted)."""
    r_lags: tuple[float, ...]
    """Correlation of each reply's total count with the drive of the stimulation it answers (lag 0), the one
    before it (lag 1), and so on (NaN: undefined)."""
    p_lags: tuple[float, ...]
    """Two-sided p of each correlation."""
    verdict: Verdict
    late_by: int = 0
    """With verdict `late`: how many stimulations late the counts are."""

    @property
    def r_current(self) -> float:
        """Counts against the stimulation they answer."""
        return self.r_lags[0]

    @property
    def r_previous(self) -> float:
        """Counts against the stimulation before it."""
        return self.r_lags[1]

    @property
    def p_current(self) -> float:
        """Two-sided p of `r_current`."""
        return self.p_lags[0]

    def as_dict(self, digits: int = 3) -> dict[str, Any]:
        """JSON-ready values (NaN as None)."""
        return {
            "n": round(self.n, 1),
            "r_current": _rounded(self.r_current, digits),
            "r_previous": _rounded(self.r_previous, digits),
            "r_lags": [_rounded(r, digits) for r in self.r_lags],
            "verdict": self.verdict,
            "late_by": self.late_by,
        }


def _rounded(x: float, digits: int) -> float | None:
    return round(x, digits) if math.isfinite(x) else None


def assess(n: float, r_lags: Sequence[float], constant_counts: bool = False, constant_stim: bool = False) -> Causality:
    """The verdict from every lag's correlation: `late` only when an earlier stimulation is followed significantly
    and clearly more strongly than the one answered (module docstring); the tests over the earlier lags share ALPHA.
    """
    r_lags = tuple(r_lags)
    p_lags = tuple(_p_two_sided(r, n) for r in r_lags)
    alpha_each = ALPHA / max(1, len(r_lags) - 1)
    late = [
        k
        for k in range(1, len(r_lags))
        if p_lags[k] < alpha_each
        and abs(r_lags[k]) > abs(r_lags[0])
        and _p_greater(r_lags[k], r_lags[0], n) < alpha_each
    ]
    verdict: Verdict
    if n < MIN_PAIRS:
        verdict = "too_few"
    elif constant_counts:
        verdict = "constant_counts"
    elif constant_stim:
        verdict = "constant_stim"
    elif late:
        verdict = "late"
    elif p_lags[0] < ALPHA and all(abs(r_lags[0]) >= abs(r) for r in r_lags[1:] if math.isfinite(r)):
        verdict = "current"
    elif any(p < ALPHA for p in p_lags):
        verdict = "mixed"
    else:
        verdict = "none"
    late_by = max(late, key=lambda k: abs(r_lags[k])) if late else 0
    return Causality(n, r_lags, p_lags, verdict, late_by)


class CausalityMeter:
    """Running sums for the correlations at lags 0..`max_lag`; `observe` once per stimulation, in the order sent.

    `window` None weighs every reply alike; a number of stimulations weighs them exponentially, so that the
    correlations follow the last `window` or so (training: the device may change, the policy's stimulation does).
    Only replies with `max_lag` stimulations before them count, so that every lag is taken over the same replies.
    """

    def __init__(self, window: float | None = None, max_lag: int = MAX_LAG) -> None:
        if window is not None and not window >= 1:
            raise ValueError(f"causality window={window!r}: give a number of stimulations >= 1, or None")
        if max_lag < 1:
            raise ValueError(f"causality max_lag={max_lag!r}: at least 1 (the previous stimulation)")
        self.max_lag = max_lag
        self._decay = 1.0 if window is None else 1.0 - 1.0 / window
        # [weight, weight^2, sum y, sum y^2] then per lag k: [sum x_k, sum x_k^2, sum x_k y]. One tuple, replaced
        # whole per reply: a reader in another thread (the live view) never sees half an update.
        self._sums: tuple[float, ...] = (0.0,) * (4 + 3 * (max_lag + 1))
        self._drives: tuple[float, ...] = ()  # the newest stimulation's drive first

    def observe(self, drive: float, total_count: float | None) -> None:
        """One stimulation's drive and its reply's total count (None: no reply was taken, e.g. a timeout)."""
        self._drives = (drive, *self._drives[: self.max_lag])
        if total_count is None or len(self._drives) <= self.max_lag:
            return
        y, d, sums = total_count, self._decay, self._sums
        new = [d * sums[0] + 1.0, d * d * sums[1] + 1.0, d * sums[2] + y, d * sums[3] + y * y]
        for k, x in enumerate(self._drives):
            i = 4 + 3 * k
            new += (d * sums[i] + x, d * sums[i + 1] + x * x, d * sums[i + 2] + x * y)
        self._sums = tuple(new)

    def snapshot(self) -> Causality:
        """The correlations and the verdict for the replies observed so far."""
        sums = self._sums
        w, w2, sy, syy = sums[:4]
        lags = self.max_lag + 1
        if w <= 0:
            return assess(0.0, (math.nan,) * lags)
        n = w * w / w2  # the effective number of replies under the weights

        def var(s: float, ss: float) -> float:
            v = ss / w - (s / w) ** 2
            return v if v > CONSTANT_SHARE * (ss / w) else 0.0

        vy = var(sy, syy)
        r_lags, constant = [], []
        for k in range(lags):
            sx, sxx, sxy = sums[4 + 3 * k : 7 + 3 * k]
            vx = var(sx, sxx)
            constant.append(vx <= 0)
            if vx <= 0 or vy <= 0:
                r_lags.append(math.nan)
            else:
                r = (sxy / w - (sx / w) * (sy / w)) / math.sqrt(vx * vy)
                r_lags.append(max(-1.0, min(1.0, r)))
        return assess(n, r_lags, constant_counts=vy <= 0, constant_stim=all(constant))
