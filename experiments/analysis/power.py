"""How many seeds a comparison needs, and the smallest difference a seed count can detect.

The approximation: **simulation of the exact tests** that `spikeloop analyze` runs. Per-seed
values are drawn from normal distributions with the measured spread (paired: the per-seed
differences ~ N(difference, sd_paired^2); unpaired: each configuration's seeds ~ N(., sd^2)),
`DRAWS` times with a fixed random seed, and each draw is tested with the exact Wilcoxon
signed-rank test (paired) or the exact Mann-Whitney test (unpaired); the power is the share of
draws with p < alpha. Exact null tables are used up to `EXACT_RANK_SUM_MAX` seeds per side
(Mann-Whitney) and for every n (signed-rank); beyond, the normal approximation of the rank
statistic. At a handful of seeds this is what decides, and a normal formula would not see it:
with n paired seeds no p below 2/2^n (two-sided) exists, so fewer than 6 can detect nothing at
alpha 0.05 whatever the difference.

The spread comes from `docs/benchmarks/learning.json` (`spikeloop bench learning`): the SD over
seeds of a condition's final figure (unpaired), and the SD of per-seed differences between that
condition and the conditions that share its device and seeds (paired; for `sim`: `zero` and
`random`, same culture and game seeds). A run's own spread is in its analysis (report.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from spikeloop.experiments.analysis import stats

DRAWS = 10_000
SIMULATION_SEED = 0
POWER = 0.8
ALPHAS = (0.05, 0.01)
MAX_SEEDS = 200
EXACT_RANK_SUM_MAX = 30
"""Seeds per side up to which the simulated Mann-Whitney test uses its exact null table."""


# --- null tables (no ties: simulated values are continuous) -------------------------------


@functools.cache
def _signed_rank_p_table(n: int, alternative: str) -> np.ndarray:
    """p of every T+ (sum of positive ranks, 0 .. n(n+1)/2) under the null, exact."""
    total = n * (n + 1) // 2
    null = np.zeros(total + 1)
    null[0] = 1.0
    for r in range(1, n + 1):
        shifted = np.zeros_like(null)
        shifted[r:] = null[: total + 1 - r]
        null = 0.5 * (null + shifted)
    return _p_table(null, alternative)


@functools.cache
def _rank_sum_p_table(n_a: int, n_b: int, alternative: str) -> np.ndarray:
    """p of every rank sum W of a (from its minimum n_a(n_a+1)/2) under the null, exact or normal."""
    n = n_a + n_b
    low, high = n_a * (n_a + 1) // 2, n_a * (n_a + 1) // 2 + n_a * n_b
    if max(n_a, n_b) > EXACT_RANK_SUM_MAX:
        from scipy import stats as scipy_stats

        w = np.arange(low, high + 1, dtype=np.float64)
        mean, sd = n_a * (n + 1) / 2, math.sqrt(n_a * n_b * (n + 1) / 12)
        if alternative == "greater":
            return scipy_stats.norm.sf((w - 0.5 - mean) / sd)
        if alternative == "less":
            return scipy_stats.norm.cdf((w + 0.5 - mean) / sd)
        return np.minimum(1.0, 2 * scipy_stats.norm.sf((np.abs(w - mean) - 0.5) / sd))
    top = high
    ways = np.zeros((n_a + 1, top + 1))
    ways[0, 0] = 1.0
    for r in range(1, n + 1):
        ways[1:, r:] += ways[:-1, : top + 1 - r].copy()
    null = ways[n_a][low:] / ways[n_a][low:].sum()
    return _p_table(null, alternative)


def _p_table(null: np.ndarray, alternative: str) -> np.ndarray:
    support = np.arange(len(null))
    if alternative == "greater":
        return np.cumsum(null[::-1])[::-1]
    if alternative == "less":
        return np.cumsum(null)
    centre = float((support * null).sum())
    distance = np.abs(support - centre)
    return np.array([min(1.0, null[distance >= d - 1e-9].sum()) for d in distance])


# --- simulated power ----------------------------------------------------------------------


def _normal_draws(n: int, width: int) -> np.ndarray:
    """The same standard normal draws for every difference tried at n (common random numbers)."""
    return np.random.default_rng([SIMULATION_SEED, n, width]).standard_normal((DRAWS, width))


def _p_values(n: int, difference: float, sd: float, paired: bool, alternative: str) -> np.ndarray:
    """The exact test's p in each simulated n-seed experiment (one argsort a draw: ranks come from the order)."""
    weights = np.arange(1, (n if paired else 2 * n) + 1)
    if paired:
        d = difference + sd * _normal_draws(n, n)
        order = np.argsort(np.abs(d), axis=1)
        positive_rank_sum = ((np.take_along_axis(d, order, axis=1) > 0) * weights).sum(axis=1)
        return _signed_rank_p_table(n, alternative)[positive_rank_sum]
    z = _normal_draws(n, 2 * n)
    z[:, :n] += difference / sd
    rank_sum = ((np.argsort(z, axis=1) < n) * weights).sum(axis=1)  # the ranks that fall to a's draws
    return _rank_sum_p_table(n, n, alternative)[rank_sum - n * (n + 1) // 2]


def simulated_power(
    n: int, difference: float, sd: float, *, paired: bool, alpha: float, alternative: str = "two-sided"
) -> float:
    """Share of simulated n-seed experiments in which the exact test gives p < alpha.

    paired: sd is the SD of per-seed differences; unpaired: the SD of each configuration's per-seed values.
    """
    stats._check_side(alternative)
    if n < 1 or not sd > 0:
        return math.nan
    return float((_p_values(n, difference, sd, paired, alternative) < alpha).mean())


def smallest_p(n: int, *, paired: bool, alternative: str = "two-sided") -> float:
    """The most extreme outcome's p with n seeds (per configuration)."""
    if paired:
        return stats.smallest_signed_rank_p(n, alternative)
    return stats.smallest_p(n, n, "two-sided" if alternative == "two-sided" else "greater")


def min_seeds(alpha: float, *, paired: bool, alternative: str = "two-sided") -> int:
    """The fewest seeds per configuration whose most extreme outcome reaches p < alpha."""
    n = 1
    while smallest_p(n, paired=paired, alternative=alternative) >= alpha:
        n += 1
    return n


def seeds_needed(
    difference: float,
    sd: float,
    *,
    paired: bool,
    alpha: float,
    power: float = POWER,
    alternative: str = "two-sided",
    max_seeds: int = MAX_SEEDS,
) -> int | None:
    """The fewest seeds per configuration with simulated power >= `power`; None if more than `max_seeds`."""
    floor = min_seeds(alpha, paired=paired, alternative=alternative)
    if floor > max_seeds or not sd > 0:
        return None

    def enough(n: int) -> bool:
        return simulated_power(n, difference, sd, paired=paired, alpha=alpha, alternative=alternative) >= power

    # Start where the normal approximation (with the rank tests' efficiency 3/pi on normal data) says,
    # then walk to the smallest n that is enough: a few simulations instead of a bisection from max_seeds.
    n = min(max_seeds, max(floor, _normal_guess(difference, sd, paired, alpha, power, alternative)))
    if enough(n):
        while n > floor and enough(n - 1):
            n -= 1
        return n
    step = 1
    while n < max_seeds:
        candidate = min(max_seeds, n + step)
        if enough(candidate):
            low, high = n + 1, candidate
            while low < high:
                middle = (low + high) // 2
                if enough(middle):
                    high = middle
                else:
                    low = middle + 1
            return low
        n, step = candidate, step * 2
    return None


def _normal_guess(difference: float, sd: float, paired: bool, alpha: float, power: float, alternative: str) -> int:
    from scipy.stats import norm

    sides = 2 if alternative == "two-sided" else 1
    z = norm.ppf(1 - alpha / sides) + norm.ppf(power)
    n = (z * sd / abs(difference)) ** 2 / (3 / math.pi) * (1 if paired else 2) if difference else math.inf
    return int(min(MAX_SEEDS, math.ceil(n)))


def detectable_difference(
    n: int, sd: float, *, paired: bool, alpha: float, power: float = POWER, alternative: str = "two-sided"
) -> float:
    """The smallest difference detected with simulated power >= `power` at n seeds; inf if none can be."""
    if n < min_seeds(alpha, paired=paired, alternative=alternative) or not sd > 0:
        return math.inf

    def enough(difference: float) -> bool:
        return simulated_power(n, difference, sd, paired=paired, alpha=alpha, alternative=alternative) >= power

    high = sd
    while not enough(high):
        high *= 2
        if high > 1e4 * sd:
            return math.inf
    low = 0.0
    while high - low > 1e-3 * sd:
        middle = (low + high) / 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return high


def at_seed_count(
    seeds: int, sd_paired: float | None, sd_unpaired: float | None, alpha: float, alternative: str = "two-sided"
) -> dict[str, Any]:
    """What `seeds` seeds per configuration can detect with a run's measured spread (paired and unpaired)."""

    def one(sd: float | None, paired: bool) -> float | None:
        if sd is None or not sd > 0 or seeds < 1:
            return None
        value = detectable_difference(seeds, sd, paired=paired, alpha=alpha, alternative=alternative)
        return value if math.isfinite(value) else None

    return {
        "seeds": seeds,
        "alpha": alpha,
        "power": POWER,
        "alternative": alternative,
        # None: not measured, or no difference of any size can reach alpha with these seeds (see smallest_p)
        "detectable_paired": one(sd_paired, True),
        # sd_unpaired is the SD of a difference of two independent seeds; each side's SD is that over sqrt(2)
        "detectable_unpaired": one(sd_unpaired / math.sqrt(2) if sd_unpaired else None, False),
        "smallest_p_paired": smallest_p(seeds, paired=True, alternative=alternative) if seeds else None,
        "smallest_p_unpaired": smallest_p(seeds, paired=False, alternative=alternative) if seeds else None,
        "min_seeds_paired": min_seeds(alpha, paired=True, alternative=alternative),
        "min_seeds_unpaired": min_seeds(alpha, paired=False, alternative=alternative),
    }
