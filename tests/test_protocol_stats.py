"""The protocol's statistics on data whose answer is known: exact tests against enumeration, the bootstraps'
coverage of their own targets, the windows of early and late play, a rest change that is there and one that
is not."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS, SPIKE_GROUP_NAMES
from spikeloop.experiments.protocol.rest import RestRecord
from spikeloop.experiments.protocol.stats import (
    block_means,
    bootstrap_difference,
    early_late,
    episode_times,
    holm,
    mann_whitney_greater,
    rest_change,
)


def brute_force_p(x: list[float], y: list[float]) -> float:
    """P(rank sum of a random len(x)-subset >= x's), by listing every subset."""
    pooled = np.array(x + y, dtype=float)
    ranks = scipy_stats.rankdata(pooled)
    observed = ranks[: len(x)].sum()
    sums = [ranks[list(c)].sum() for c in itertools.combinations(range(len(pooled)), len(x))]
    return float(np.mean(np.array(sums) >= observed - 1e-9))


def test_exact_mann_whitney_equals_scipy_without_ties() -> None:
    rng = np.random.default_rng(1)
    for n_x, n_y in ((5, 7), (12, 4), (20, 20)):
        x, y = rng.normal(0.5, 1, n_x), rng.normal(0, 1, n_y)
        ours = mann_whitney_greater(x, y, rng)
        theirs = scipy_stats.mannwhitneyu(x, y, alternative="greater", method="exact")
        assert ours["method"] == "exact"
        assert ours["u"] == pytest.approx(theirs.statistic)
        assert ours["p"] == pytest.approx(theirs.pvalue, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_exact_mann_whitney_with_ties_equals_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, 6).astype(float).tolist()  # returns that repeat, as game returns do
    y = rng.integers(0, 3, 5).astype(float).tolist()
    ours = mann_whitney_greater(x, y, rng)
    assert ours["method"].startswith("exact")
    assert ours["p"] == pytest.approx(brute_force_p(x, y), abs=1e-12)
    swapped = mann_whitney_greater(y, x, rng)  # the other side is tracked when it is the smaller one
    assert swapped["p"] == pytest.approx(brute_force_p(y, x), abs=1e-12)


def test_kill_rates_get_the_hypergeometric_tail() -> None:
    # 0/1 outcomes: the exact Mann-Whitney is Fisher's one-sided test.
    late = [1.0] * 9 + [0.0] * 3
    early = [1.0] * 3 + [0.0] * 7
    ours = mann_whitney_greater(late, early, np.random.default_rng(0))
    fisher = scipy_stats.fisher_exact([[9, 3], [3, 7]], alternative="greater").pvalue
    assert ours["p"] == pytest.approx(fisher, rel=1e-9)


def test_monte_carlo_takes_over_beyond_the_work_limit_and_agrees() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(-5, 5, 60).astype(float) + 1.0
    y = rng.integers(-5, 5, 50).astype(float)
    exact = mann_whitney_greater(x, y, rng)
    estimated = mann_whitney_greater(x, y, rng, work_limit=0)
    assert exact["method"] == "exact" and estimated["method"].startswith("Monte Carlo")
    assert estimated["p"] == pytest.approx(exact["p"], abs=0.01)


def test_a_window_without_episodes_has_no_test() -> None:
    out = mann_whitney_greater([1.0, 2.0], [], np.random.default_rng(0))
    assert out["p"] is None and out["u"] is None


def test_bootstrap_interval_covers_the_true_difference_about_95_percent() -> None:
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        late, early = rng.normal(1.0, 1.0, 40), rng.normal(0.0, 1.0, 40)
        low, high = bootstrap_difference(late, early, 2000, rng)["ci95"]
        covered += low <= 1.0 <= high
    assert 0.88 <= covered / 200 <= 0.99


def test_block_bootstrap_widens_for_autocorrelated_activity() -> None:
    rng = np.random.default_rng(11)
    ticks = 3000
    noise = rng.normal(0, 1, ticks)
    ar = np.zeros(ticks)
    for t in range(1, ticks):  # AR(1), phi 0.9: bursts that outlast a tick
        ar[t] = 0.9 * ar[t - 1] + noise[t]
    series = ar[:, None]
    per_tick = block_means(series, 1, 4000, rng)[:, 0].std()
    per_block = block_means(series, 50, 4000, rng)[:, 0].std()
    true_se = ar.std() * math.sqrt((1 + 0.9) / (1 - 0.9) / ticks)  # the AR(1) mean's standard error
    assert per_block == pytest.approx(true_se, rel=0.3)
    assert per_tick < 0.5 * true_se  # single ticks would claim far too much precision


def test_holm_adjusts_step_down() -> None:
    assert holm([0.01, 0.04, 0.03, None]) == [0.03, 0.06, 0.06, None]
    assert holm([0.5, 0.6]) == [1.0, 1.0]


def episode(index: int, length: int, reward: float, kills: int, runner: int = 1) -> dict:
    return {
        "episode": index,
        "episode_length": length,
        "episode_reward": reward,
        "kill_count": kills,
        "env_runner": runner,
    }


def test_early_and_late_windows_hold_the_episodes_wholly_inside_them() -> None:
    # One culture, 0.1 s a step: episodes of 10 s, 20 s, 5 s, 30 s, 10 s, then 4 s still going at the stop.
    records = [episode(1, 100, -5, 0), episode(2, 200, -4, 0), episode(3, 50, 1, 1), episode(4, 300, 2, 1)]
    records.append(episode(5, 100, 3, 1))
    timed, play_s = episode_times(records, 0.1, {1: 40})
    assert [(round(a, 6), round(b, 6)) for a, b, _ in timed] == [(0, 10), (10, 30), (30, 35), (35, 65), (65, 75)]
    assert play_s == {1: pytest.approx(79.0)}
    out = early_late(
        records, step_s=0.1, unfinished_steps={1: 40}, early_s=30, late_s=45, resamples=1000,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    assert out["early"]["episodes"] == 2  # 0-10 and 10-30; 30-35 ends after 30
    assert out["late"]["episodes"] == 2  # the last 45 s are 34-79: 35-65 and 65-75
    assert out["return"]["early_mean"] == -4.5 and out["return"]["late_mean"] == 2.5
    assert out["return"]["late_minus_early"] == 7.0
    assert out["kill_rate"]["late_minus_early"] == 1.0
    assert out["return"]["p_one_sided"] == pytest.approx(1 / 6)  # complete separation, 2 vs 2: 1 / C(4, 2)


def test_each_culture_keeps_its_own_clock() -> None:
    records = [episode(1, 100, 0, 0, runner=1), episode(2, 300, 0, 0, runner=2), episode(3, 100, 0, 0, runner=1)]
    timed, play_s = episode_times(records, 0.1, {})
    assert play_s == {1: pytest.approx(20.0), 2: pytest.approx(30.0)}
    assert [round(a, 6) for a, _, r in timed if r["episode"] == 3] == [10.0]


def rest_record(counts: np.ndarray, phase: str) -> RestRecord:
    cultures, ticks, _ = counts.shape
    return RestRecord(
        phase=phase,
        tick_s=0.1,
        counts=counts,
        answered=np.ones((cultures, ticks), dtype=bool),
        stim_timestamp_us=np.arange(cultures * ticks, dtype=np.uint64).reshape(cultures, ticks),
        device_ids=tuple(f"sim-{c}" for c in range(cultures)),
        runners=tuple(range(cultures)),
        wall_start=0.0,
        wall_end=1.0,
    )


def test_rest_change_finds_a_real_shift_and_leaves_the_other_groups_alone() -> None:
    rng = np.random.default_rng(5)
    before = rng.poisson(3.0, (1, 2000, N_SPIKE_GROUPS)).astype(np.float32)
    after = rng.poisson(3.0, (1, 2000, N_SPIKE_GROUPS)).astype(np.float32)
    attack = SPIKE_GROUP_NAMES.index("attack")
    after[0, :, attack] += rng.poisson(1.0, 2000)  # the attack group fires one count a tick more at rest
    after[0, :30] += 100  # play's after-effect in the first 3 s: left out by the settle time
    out = rest_change(
        rest_record(before, "rest_before"), rest_record(after, "rest_after"),
        settle_s=3.0, block_s=2.0, resamples=4000, rng=rng,
    )  # fmt: skip
    assert out["settle_ticks"] == 30 and out["block_ticks"] == 20
    assert out["ticks_answered"] == {"before": [1970], "after": [1970]}
    groups = out["groups"]
    assert groups["attack"]["change"] == pytest.approx(1.0, abs=0.15)
    assert groups["attack"]["p_holm"] < 0.01 and groups["attack"]["ci95"][0] > 0.5
    others = [g for g in SPIKE_GROUP_NAMES if g != "attack"]
    assert all(abs(groups[g]["change"]) < 0.3 for g in others)
    assert sum(groups[g]["p_holm"] < 0.05 for g in others) == 0
    assert groups["total"]["change"] == pytest.approx(sum(groups[g]["change"] for g in SPIKE_GROUP_NAMES))
