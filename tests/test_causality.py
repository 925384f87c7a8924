"""spikeloop.bridge.trainer.causality: the running correlations and the verdict that `spikeloop check` and training rely on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from spikeloop.bridge.trainer.causality import ALPHA, MAX_LAG, MIN_PAIRS, CausalityMeter, assess, stim_drive


def meter_for(drives: np.ndarray, counts: np.ndarray, window: float | None = None) -> CausalityMeter:
    meter = CausalityMeter(window)
    for x, y in zip(drives, counts, strict=True):
        meter.observe(float(x), None if np.isnan(y) else float(y))
    return meter


def test_stim_drive_is_the_sum_of_frequency_times_amplitude():
    assert stim_drive([20.0] * 8, [1.5] * 8) == 240.0
    assert stim_drive([1.0, 40.0], [0.5, 2.5]) == 100.5


def partial_r(y: np.ndarray, lags: list[np.ndarray], k: int) -> tuple[float, float]:
    """Partial correlation of y with lags[k] given the other lags, by regression residuals; and its exact p."""
    others = np.column_stack([np.ones_like(y)] + [x for i, x in enumerate(lags) if i != k])

    def residual(v: np.ndarray) -> np.ndarray:
        return v - others @ np.linalg.lstsq(others, v, rcond=None)[0]

    r, _ = stats.pearsonr(residual(y), residual(lags[k]))
    dof = len(y) - 2 - (len(lags) - 1)
    t = r * math.sqrt(dof / (1 - r * r))
    return float(r), float(2 * stats.t.sf(abs(t), dof))


def test_unweighted_correlations_are_partial_over_the_same_replies():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 100, 200)
    x = x + 0.7 * np.r_[0.0, x[:-1]]  # successive stimulations alike, as in training
    y = 0.5 * x + 0.3 * np.r_[0.0, x[:-1]] + rng.normal(0, 10, 200)
    c = meter_for(x, y).snapshot()
    # Every lag over the replies that have MAX_LAG stimulations before them.
    lags = [x[MAX_LAG - k : len(x) - k] for k in range(MAX_LAG + 1)]
    for k in range(MAX_LAG + 1):
        expected_r, expected_p = partial_r(y[MAX_LAG:], lags, k)
        assert c.r_lags[k] == pytest.approx(expected_r, abs=1e-9)
        # Fisher's z is close to the exact t test where it matters.
        if 1e-12 < expected_p < 0.01:
            assert math.log10(c.p_lags[k]) == pytest.approx(math.log10(expected_p), rel=0.1)
    assert c.n == pytest.approx(200 - MAX_LAG)
    assert c.verdict == "current" and c.r_current > c.r_previous > 0.3 > abs(c.r_lags[2])


def test_alike_successive_stimulations_do_not_make_a_correct_device_look_late():
    rng = np.random.default_rng(7)
    x = np.cumsum(rng.normal(0, 1, 1000))  # a slowly wandering stimulation: plain correlations carry each other
    y = x + rng.normal(0, 3, 1000)
    plain = np.corrcoef(x[1:], y[1:])[0, 1], np.corrcoef(x[:-1], y[1:])[0, 1]
    assert abs(plain[0] - plain[1]) < 0.02  # the plain r can hardly tell lag 0 from lag 1...
    c = meter_for(x, y).snapshot()
    assert c.verdict == "current" and c.r_current > 0.2 and abs(c.r_previous) < 0.1  # ...the partial can
    late = meter_for(x, np.r_[0.0, y[:-1]]).snapshot()
    assert late.verdict == "late" and late.late_by == 1
    exact = meter_for(x, np.r_[0.0, x[:-1]]).snapshot()  # noise-free: the counts ARE the previous drive
    assert exact.verdict == "late" and exact.r_previous == 1.0 and exact.r_current == 0.0


def test_a_timeout_leaves_its_reply_out_but_its_stimulation_counts_as_the_previous():
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0])
    y = np.array([0.0, 0.0, 5.0, np.nan, 1.0, 9.0, 2.0, 7.0, 4.0, 4.0])
    c = meter_for(x, y).snapshot()
    kept = np.array([2, 4, 5, 6, 7, 8, 9])  # reply 3 timed out; replies 0 and 1 have fewer than MAX_LAG before them
    assert c.n == len(kept)
    lags = [x[kept - k] for k in range(MAX_LAG + 1)]
    assert c.r_previous == pytest.approx(partial_r(y[kept], lags, 1)[0])


def test_weighted_correlations_follow_the_recent_window():
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, 3000)
    noise = rng.normal(0, 0.1, 3000)
    # The device answers on time for 2,000 stimulations, then turns one stimulation late.
    y = np.where(np.arange(3000) < 2000, x, np.r_[0.0, x[:-1]]) + noise
    meter = meter_for(x, y, window=200)
    c = meter.snapshot()
    assert c.n == pytest.approx(2 * 200 - 1, rel=0.01)  # the effective count of weights decaying by 1/200
    assert c.verdict == "late" and c.late_by == 1
    assert c.r_previous > 0.9 > 0.2 > abs(c.r_current)
    assert meter_for(x[:2000], y[:2000], window=200).snapshot().verdict == "current"


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_the_verdict_names_the_stimulation_the_counts_follow(lag):
    rng = np.random.default_rng(lag)
    x = rng.permutation([20.0] * 20 + [1.0] * 20)  # the probe's kind of pattern: on and off, shuffled
    y = np.r_[np.zeros(lag), x[: len(x) - lag]] * 9 + rng.poisson(6, len(x))
    c = meter_for(x, y).snapshot()
    assert c.verdict == ("current" if lag == 0 else "late")
    assert c.late_by == lag


def test_counts_without_a_stimulus_are_never_late():
    """The random ablation over 2,000 probes of 40: no verdict but `none`, bar what ALPHA allows."""
    rng = np.random.default_rng(0)
    pattern = rng.permutation([20.0] * 20 + [1.0] * 20)
    verdicts = [meter_for(pattern, rng.poisson(40, 40).astype(float)).snapshot().verdict for _ in range(2000)]
    assert verdicts.count("late") <= 2 and verdicts.count("current") <= 2, {v: verdicts.count(v) for v in verdicts}
    assert verdicts.count("none") >= 1990


def test_a_weak_response_carried_into_the_next_reply_is_not_late():
    """A culture whose response lingers: counts follow both, their own more; that is not a late device."""
    rng = np.random.default_rng(5)
    x = rng.permutation([1.0] * 20 + [0.0] * 20)
    y = 30 * x + 20 * np.r_[0.0, x[:-1]] + rng.normal(0, 3, 40)
    assert meter_for(x, y).snapshot().verdict == "current"


def test_constant_sides_and_too_few_replies_decide_nothing():
    x = np.tile([1.0, 20.0], 20)
    assert meter_for(x, np.zeros(40)).snapshot().verdict == "constant_counts"  # the zero ablation
    assert meter_for(np.full(40, 4.0), np.arange(40.0)).snapshot().verdict == "constant_stim"  # minimum only
    short = MIN_PAIRS + MAX_LAG - 1
    assert meter_for(x[:short], 10 * x[:short]).snapshot().verdict == "too_few"
    assert CausalityMeter().snapshot().verdict == "too_few"  # nothing observed: no division by zero
    c = meter_for(np.full(40, 4.0), np.zeros(40)).snapshot()
    assert math.isnan(c.r_current) and c.as_dict()["r_current"] is None


def test_assess_needs_the_earlier_lag_significant_and_clearly_stronger():
    assert assess(40, (0.1, 0.9, 0.0)).verdict == "late"
    assert assess(40, (0.6, 0.7, 0.0)).verdict == "mixed"  # stronger, but not clearly: not late
    assert assess(40, (0.7, 0.6, 0.0)).verdict == "current"
    assert assess(40, (0.39, 0.8, 0.22)).verdict == "late"  # not clearly stronger, but the own one not significant
    assert assess(40, (0.1, 0.3, 0.0)).verdict == "none"  # not significant at ALPHA for 40 replies
    assert assess(1000, (0.1, 0.3, 0.0)).verdict == "late"  # ...which 1,000 replies are
    assert ALPHA <= 0.001


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="window"):
        CausalityMeter(window=0.5)
    with pytest.raises(ValueError, match="max_lag"):
        CausalityMeter(max_lag=0)
