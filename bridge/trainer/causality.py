"""Does each reply answer the stimulation it is taken for? Correlations at a few lags tell.

Protocol v1 promises one reply per stimulation, carrying the spikes counted in
the windows after *that* stimulation (artifact wait, then collection window).
Timestamps cannot prove it: a device that applies each stimulation only after
the tick it reports echoes every stamp correctly and still answers stimulation
n with the culture's response to stimulation n-1. Only the counts can show it.

So each stimulation is reduced to one number, its drive (`stim_drive`), each
reply to its total count, and the counts are correlated with the drive of the
stimulation they answer (lag 0, `r_current`), of the one before it (lag 1,
`r_previous`), and so on up to `MAX_LAG`, over the same replies. Each is a
partial correlation: the other lags' part is taken out first. In training,
successive stimulations are alike (successive frames are), so plain
correlations carry each other: with the quickstart's culture, 0.46 at lag 0 and
0.34 at lag 1 for a correct device; partial, 0.32 and 0.06. `spikeloop
check`'s probe is a shuffled on/off pattern, so there the two kinds agree.

A device that answers in time shows |r_current| above the others (once the
culture responds at all); a device one stimulation late shows |r_previous|
above |r_current|. A device whose counts carry no stimulus (the `zero` and
`random` ablations, a culture that does not respond at the level used) shows
nothing significant at any lag, and is not late: `assess` decides with every
lag's correlation and its significance for the number of replies.

`CausalityMeter` keeps running sums only (16 floats, updated per reply):
unweighted for `spikeloop check`'s probe, exponentially weighted over a window
of stimulations during training. Significance uses Fisher's z transform (normal
approximation: numpy, no scipy).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

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
    frequencies, amplitudes = np.asarray(frequencies_hz, dtype=np.float64), np.asarray(amplitudes_ua, dtype=np.float64)
    if frequencies.shape != amplitudes.shape:
        raise ValueError(f"stim_drive: {frequencies.size} frequencies but {amplitudes.size} amplitudes")
    return float(frequencies @ amplitudes)


def _p_two_sided(r: float, dof: float) -> float:
    """P(|r| at least this large | no correlation), Fisher's z; `dof` is n - 3 less the variables partialled out."""
    if not math.isfinite(r) or dof <= 0:
        return 1.0
    z = math.atanh(min(abs(r), 1 - 1e-12)) * math.sqrt(dof)
    return math.erfc(z / math.sqrt(2))


def _p_greater(r_big: float, r_small: float, dof: float) -> float:
    """P(|r_big| exceeds |r_small| by this much | equal strength), one-sided, the two taken as independent."""
    if not (math.isfinite(r_big) and math.isfinite(r_small)) or dof <= 0:
        return 1.0
    z_big, z_small = (math.atanh(min(abs(r), 1 - 1e-12)) for r in (r_big, r_small))
    z = (z_big - z_small) / math.sqrt(2.0 / dof)
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class Causality:
    """What the replies so far say about which stimulation they answer."""

    n: float
    """Replies counted (the effective number, when weighted)."""
    r_lags: tuple[float, ...]
    """Partial correlation of each reply's total count with the drive of the stimulation it answers (lag 0), the
    one before it (lag 1), and so on, each with the other lags taken out (NaN: undefined)."""
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
    and more strongly than the one answered, clearly so, or with the one answered not followed significantly (a
    device whose lag wanders between 1 and 2 with the trainer's timing); the tests over earlier lags share ALPHA.
    """
    r_lags = tuple(r_lags)
    dof = n - 3 - (len(r_lags) - 1)  # each is partial on the other lags
    p_lags = tuple(_p_two_sided(r, dof) for r in r_lags)
    alpha_each = ALPHA / max(1, len(r_lags) - 1)
    own_unclear = not p_lags[0] < ALPHA  # the counts do not follow their own stimulation significantly
    late = [
        k
        for k in range(1, len(r_lags))
        if p_lags[k] < alpha_each
        and abs(r_lags[k]) > abs(r_lags[0])
        and (own_unclear or _p_greater(r_lags[k], r_lags[0], dof) < alpha_each)
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
        lags = max_lag + 1
        self._pairs = [(i, j) for i in range(lags) for j in range(i, lags)]
        # weight, weight^2, sum y, sum y^2, per lag sum x_k and sum x_k y, per pair of lags sum x_i x_j. One tuple,
        # replaced whole per reply: a reader in another thread (the live view) never sees half an update.
        self._sums: tuple[float, ...] = (0.0,) * (4 + 2 * lags + len(self._pairs))
        self._decays = (self._decay, self._decay**2) + (self._decay,) * (len(self._sums) - 2)
        self._drives: tuple[float, ...] = ()  # the newest stimulation's drive first

    def observe(self, drive: float, total_count: float | None) -> None:
        """One stimulation's drive and its reply's total count (None: no reply was taken, e.g. a timeout)."""
        self._drives = x = (drive, *self._drives[: self.max_lag])
        if total_count is None or len(x) <= self.max_lag:
            return
        y = total_count
        terms = (1.0, 1.0, y, y * y, *x, *[xk * y for xk in x], *[x[i] * x[j] for i, j in self._pairs])
        self._sums = tuple(map(operator.add, map(operator.mul, self._decays, self._sums), terms))

    def snapshot(self) -> Causality:
        """The correlations and the verdict for the replies observed so far."""
        lags = self.max_lag + 1
        sums = np.asarray(self._sums)
        w, w2, sy, syy = sums[:4]
        if w <= 0:
            return assess(0.0, (math.nan,) * lags)
        n = float(w * w / w2)  # the effective number of replies under the weights
        sx, sxy = sums[4 : 4 + lags] / w, sums[4 + lags : 4 + 2 * lags] / w
        # The covariance matrix of (y, x_0 .. x_max_lag) from the weighted moments.
        cov = np.empty((lags + 1, lags + 1))
        cov[0, 0] = syy / w - (sy / w) ** 2
        cov[0, 1:] = cov[1:, 0] = sxy - sx * (sy / w)
        for (i, j), sxx in zip(self._pairs, sums[4 + 2 * lags :] / w, strict=True):
            cov[1 + i, 1 + j] = cov[1 + j, 1 + i] = sxx - sx[i] * sx[j]
        mean_squares = np.r_[syy / w, sums[4 + 2 * lags :][[self._pairs.index((k, k)) for k in range(lags)]] / w]
        flat = np.diag(cov) <= CONSTANT_SHARE * mean_squares
        constant_counts, constant_stim = bool(flat[0]), bool(flat[1:].all())
        r_lags = _partial_correlations(cov) if not flat.any() else np.full(lags, math.nan)
        return assess(n, tuple(float(r) for r in r_lags), constant_counts, constant_stim)


def _partial_correlations(cov: np.ndarray) -> np.ndarray:
    """Partial correlation of variable 0 with each other one, all the rest taken out.

    NaN when the others move in lockstep (their parts cannot be told apart); 0 for a variable that adds nothing
    because the rest already explain variable 0 entirely (a noise-free late device: the lag it answers does).
    """
    scale = np.sqrt(np.diag(cov))
    corr = cov / np.outer(scale, scale)
    r_y, r_x = corr[0, 1:], corr[1:, 1:]
    m = len(r_y)
    if np.linalg.cond(r_x) > 1e8:
        return np.full(m, math.nan)
    partial = np.empty(m)
    for k in range(m):
        rest = [i for i in range(m) if i != k]
        inverse = np.linalg.inv(r_x[np.ix_(rest, rest)])
        # Residual (co)variances of y and x_k once the other lags are regressed out.
        left_y = 1.0 - r_y[rest] @ inverse @ r_y[rest]
        left_k = 1.0 - r_x[k, rest] @ inverse @ r_x[k, rest]
        shared = r_y[k] - r_y[rest] @ inverse @ r_x[k, rest]
        partial[k] = 0.0 if left_y <= 1e-12 else shared / math.sqrt(left_y * left_k)
    return np.clip(partial, -1.0, 1.0)
