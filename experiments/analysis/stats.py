"""Statistics that stay honest at a handful of seeds.

Two families of tests, both exact:

- `compare` / `verdict` (the ablation notebook, `spikeloop bench learning`): per-seed final
  returns of two groups, exact Mann-Whitney (`rank_sum_test`, exact with ties), one-sided by default.
- the sweep analysis (`spikeloop analyze`): `signed_rank_test` on per-seed differences where
  seeds are paired, `rank_sum_test` (Mann-Whitney) where they are not. Both compute their null
  distribution exactly by counting (dynamic programming over doubled mid-ranks), so ties and
  zero differences are handled exactly too; `holm` corrects a family of them, `mean_interval` and
  `difference_interval` give t intervals below 10 seeds and percentile bootstrap ones from there, `pairing_spread` says how much pairing narrowed the differences.

A test's smallest reachable p depends only on the number of seeds (`smallest_p`,
`smallest_signed_rank_p`): below alpha no outcome could ever be significant, and the verdicts
say so instead of reporting "no difference".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALTERNATIVES = ("greater", "two-sided")
"""Hypotheses `compare` tests: "greater" (one-sided: group a scores higher than b) or "two-sided"."""


def _check_alternative(alternative: str) -> str:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(map(repr, ALTERNATIVES))}, not {alternative!r}")
    return alternative


@dataclass(frozen=True)
class Comparison:
    """Final-window returns of two groups of seeds, the test of their difference and its effect size.

    The test that decides (`mann_whitney_p`) is the Mann-Whitney U test: it assumes no normality
    of the per-seed returns, and its p-value is exact, ties included (`rank_sum_test`), so it
    stays valid at the handful of seeds a run affords. Welch's t-test (`welch_p`, same alternative) is reported
    alongside as a secondary figure only: at a few seeds its normality assumption cannot be
    checked, and it can give small p-values that the data do not support.
    """

    name_a: str
    name_b: str
    a: np.ndarray
    b: np.ndarray
    welch_p: float
    mann_whitney_p: float
    alternative: str = "greater"
    cliffs_delta: float = math.nan
    """P(a > b) - P(a < b) over all seed pairs, in [-1, 1]; = 2U/(n_a n_b) - 1 with U the Mann-Whitney U of a."""
    mann_whitney_exact: bool = True
    """False only above `EXACT_RANK_SUM_MAX` seeds in all with tied returns, where the normal approximation decides."""

    @property
    def difference(self) -> float:
        """Mean of a minus mean of b."""
        return float(np.mean(self.a) - np.mean(self.b)) if len(self.a) and len(self.b) else math.nan


def cliffs_delta(a: Sequence[float], b: Sequence[float]) -> float:
    """Cliff's delta of a over b: (pairs with a > b - pairs with a < b) / (n_a n_b); NaN when a side is empty."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not len(a) or not len(b):
        return math.nan
    return float(np.sign(a[:, None] - b[None, :]).mean())


def compare(
    name_a: str, returns_a: Sequence[float], name_b: str, returns_b: Sequence[float], alternative: str = "greater"
) -> Comparison:
    """Mann-Whitney U (the test that decides) and Welch's t-test on per-seed final returns, plus Cliff's delta.

    `alternative="greater"` tests the one-sided hypothesis that group a scores higher than
    group b; "two-sided" tests for a difference either way. Mann-Whitney's null distribution is
    exact, tied returns included (`rank_sum_test`: tied returns share their mid-rank); only past
    `EXACT_RANK_SUM_MAX` seeds in all does it fall back to scipy (exact without ties, else the normal
    approximation). Non-finite returns are dropped. A p-value is NaN where its test cannot run:
    Mann-Whitney with an empty side, Welch with under 2 seeds a side; both are 1.0 when every return is equal.
    """
    from scipy import stats

    _check_alternative(alternative)
    a = np.asarray([r for r in returns_a if math.isfinite(r)], dtype=np.float64)
    b = np.asarray([r for r in returns_b if math.isfinite(r)], dtype=np.float64)
    welch = mwu = math.nan
    exact = True
    if len(a) and len(b):
        pooled = np.concatenate([a, b])
        if np.ptp(pooled) == 0:
            welch = mwu = 1.0
        else:
            if len(pooled) <= EXACT_RANK_SUM_MAX:
                mwu = rank_sum_test(a, b, alternative).p
            else:  # the exact count grows as N^3; scipy's exact test needs untied data
                exact = len(np.unique(pooled)) == len(pooled)
                method = "exact" if exact else "asymptotic"
                mwu = float(stats.mannwhitneyu(a, b, alternative=alternative, method=method).pvalue)
            if len(a) >= 2 and len(b) >= 2:
                welch = float(stats.ttest_ind(a, b, equal_var=False, alternative=alternative).pvalue)
    return Comparison(name_a, name_b, a, b, welch, mwu, alternative, cliffs_delta(a, b), exact)


def smallest_p(n_a: int, n_b: int, alternative: str = "greater") -> float:
    """The smallest p the exact Mann-Whitney test can give with n_a vs n_b seeds (at complete separation).

    One-sided: 1 / C(n_a + n_b, n_a), the chance of one particular ordering of the ranks; two-sided: twice that.
    """
    sides = 2 if _check_alternative(alternative) == "two-sided" else 1
    if n_a < 1 or n_b < 1:
        return math.nan
    return min(1.0, sides / math.comb(n_a + n_b, n_a))


def min_seeds_per_group(alpha: float = 0.05, alternative: str = "greater") -> int:
    """The fewest seeds per group with which the exact Mann-Whitney test can reach p < alpha.

    n vs n seeds can give at best p = 1 / C(2n, n) one-sided (2 / C(2n, n) two-sided), when
    every seed of one group beats every seed of the other. With fewer seeds no outcome of the
    runs could be significant, so a test would only ever say "no difference". For example:
    alpha 0.05 one-sided -> 4 (1/70; 3 seeds give 1/20 = 0.05, not below), alpha 0.01
    one-sided -> 5 (1/252), alpha 0.05 two-sided -> 4 (2/70).
    """
    _check_alternative(alternative)
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], not {alpha!r}")
    n = 1
    while smallest_p(n, n, alternative) >= alpha:
        n += 1
    return n


MIN_SEEDS_FOR_A_CLAIM = min_seeds_per_group(0.05, "greater")
"""Seeds per group the verdict needs at alpha 0.05, one-sided (4); fewer and it claims nothing, whatever the p."""


def verdict(comparison: Comparison, alpha: float = 0.05) -> str:
    """One plain sentence on what the comparison shows, erring towards "no evidence".

    Decided by the Mann-Whitney p alone (see `Comparison`); with fewer seeds a side than
    `min_seeds_per_group(alpha, comparison.alternative)` it claims nothing.
    """
    c = comparison
    n_a, n_b = len(c.a), len(c.b)
    sided = "one-sided" if c.alternative == "greater" else "two-sided"
    means = (
        f"final-window return {c.name_a} {np.mean(c.a):.2f} vs {c.name_b} {np.mean(c.b):.2f}"
        if n_a and n_b
        else "no finished episodes on one side"
    )
    needed = min_seeds_per_group(alpha, c.alternative)
    if min(n_a, n_b) < needed:
        best = smallest_p(n_a, n_b, c.alternative)
        reach = (
            f"the smallest p an exact {sided} Mann-Whitney test can give with {n_a} vs {n_b} seeds is "
            f"{best:.3g}, not below alpha={alpha:g}"
            if n_a and n_b
            else "there is nothing to test"
        )
        return (
            f"{c.name_a} vs {c.name_b}: no evidence either way — {n_a} vs {n_b} seed(s); at least {needed} "
            f"per group are needed ({needed} vs {needed} can reach p={smallest_p(needed, needed, c.alternative):.3g}"
            f" < {alpha:g}), and {reach} ({means})."
        )
    tests = (
        f"Cliff's delta {c.cliffs_delta:+.2f}; Mann-Whitney {sided} p={c.mann_whitney_p:.3g}, "
        f"Welch {sided} p={c.welch_p:.3g}; {n_a} vs {n_b} seeds"
    )
    if c.mann_whitney_p < alpha:
        if c.alternative == "greater":
            return f"{c.name_a} vs {c.name_b}: {c.name_a} scores higher than {c.name_b} ({means}; {tests})."
        higher, lower = (c.name_a, c.name_b) if c.cliffs_delta > 0 else (c.name_b, c.name_a)
        return f"{c.name_a} vs {c.name_b}: {higher} scores higher than {lower} ({means}; {tests})."
    direction = f" in the direction tested, {c.name_a} higher than {c.name_b}" if c.alternative == "greater" else ""
    return f"{c.name_a} vs {c.name_b}: no evidence of a difference{direction} ({means}; {tests})."


# --- exact rank tests with ties (the sweep analysis) -----------------------------------

SIDES = ("two-sided", "greater", "less")
"""Hypotheses of the sweep tests: a difference either way, or a (the configuration) above / below b (the baseline)."""
EXACT_RANK_SUM_MAX = 60
"""Above this many trials in all, `rank_sum_test` uses the normal approximation (the exact count grows as N^3)."""


def _check_side(alternative: str) -> str:
    if alternative not in SIDES:
        raise ValueError(f"alternative must be one of {', '.join(map(repr, SIDES))}, not {alternative!r}")
    return alternative


RELATIVE_TIE = 1e-9
"""Values closer than this share of the largest magnitude tie (and differences that small are zero):
per-seed means of the same episodes reach a test through different float sums."""


def _tolerance(values: np.ndarray) -> float:
    return RELATIVE_TIE * float(np.max(np.abs(values))) if len(values) else 0.0


def _midranks_doubled(values: np.ndarray) -> np.ndarray:
    """Twice the mid-ranks (1-based) of `values`: whole numbers even where values tie."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    tie = _tolerance(values)
    doubled = np.empty(len(values), dtype=np.int64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] - sorted_values[start] <= tie:
            end += 1
        doubled[order[start : end + 1]] = start + end + 2  # (start+1 + end+1) = twice the mean rank
        start = end + 1
    return doubled


def _p_from_null(null: np.ndarray, observed: int, alternative: str) -> float:
    """p of an observed statistic from its exact null distribution (`null[s]` = P(statistic = s))."""
    support = np.arange(len(null))
    tiny = 1e-12  # probabilities are sums of floats: compare the statistic, never the probabilities
    if alternative == "greater":
        p = null[support >= observed].sum()
    elif alternative == "less":
        p = null[support <= observed].sum()
    else:
        centre = float((support * null).sum())
        p = null[np.abs(support - centre) >= abs(observed - centre) - tiny].sum()
    return float(min(1.0, p))


@dataclass(frozen=True)
class RankTest:
    """An exact rank test's result: what was tested, its p and the smallest p it could have given."""

    name: str
    n: int
    """Paired: non-zero differences (zeros carry no sign); unpaired: trials in all."""
    statistic: float
    p: float
    smallest_p: float
    """The p of the most extreme outcome these seeds allow (every difference one way, or complete separation)."""
    alternative: str
    exact: bool = True


def signed_rank_test(differences: Sequence[float], alternative: str = "two-sided") -> RankTest:
    """Exact Wilcoxon signed-rank test of per-seed paired differences (zeros dropped, ties at mid-ranks).

    The null distribution counts all 2^n sign assignments of the non-zero differences' ranks, so the
    p-value is exact for any n, with ties. "greater": the differences tend to be positive.
    """
    _check_side(alternative)
    d = np.asarray([x for x in differences if math.isfinite(x)], dtype=np.float64)
    d = d[np.abs(d) > _tolerance(d)] if np.any(d) else d[:0]
    n = len(d)
    if n == 0:
        return RankTest("exact Wilcoxon signed-rank", 0, 0.0, 1.0, 1.0, alternative)
    ranks = _midranks_doubled(np.abs(d))
    null = np.zeros(int(ranks.sum()) + 1)
    null[0] = 1.0
    for r in ranks:  # each rank joins the positive sum with probability 1/2
        shifted = np.zeros_like(null)
        shifted[r:] = null[: len(null) - r]
        null = 0.5 * (null + shifted)
    observed = int(ranks[d > 0].sum())
    most = 0 if alternative == "less" else int(ranks.sum())
    best = _p_from_null(null, most, alternative)
    return RankTest(
        "exact Wilcoxon signed-rank", n, observed / 2, _p_from_null(null, observed, alternative), best, alternative
    )


def smallest_signed_rank_p(n: int, alternative: str = "two-sided") -> float:
    """The smallest p the exact signed-rank test can give with n paired seeds: 1/2^n one-sided, 2/2^n two-sided."""
    _check_side(alternative)
    if n < 1:
        return 1.0
    return min(1.0, (2 if alternative == "two-sided" else 1) / 2**n)


def min_paired_seeds(alpha: float, alternative: str = "two-sided") -> int:
    """The fewest paired seeds with which the exact signed-rank test can reach p < alpha (6 at 0.05 two-sided)."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], not {alpha!r}")
    n = 1
    while smallest_signed_rank_p(n, alternative) >= alpha:
        n += 1
    return n


def rank_sum_test(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> RankTest:
    """Mann-Whitney / Wilcoxon rank-sum test of a against b, exact with ties up to `EXACT_RANK_SUM_MAX` trials.

    The exact null distribution counts every way of choosing len(a) of the pooled mid-ranks; above the
    limit the normal approximation with tie correction is used (`exact` False). "greater": a tends higher.
    """
    _check_side(alternative)
    a = np.asarray([x for x in a if math.isfinite(x)], dtype=np.float64)
    b = np.asarray([x for x in b if math.isfinite(x)], dtype=np.float64)
    n_a, n_b = len(a), len(b)
    name = "exact Mann-Whitney"
    if not n_a or not n_b:
        return RankTest(name, n_a + n_b, math.nan, math.nan, math.nan, alternative)
    ranks = _midranks_doubled(np.concatenate([a, b]))
    observed = int(ranks[:n_a].sum())
    u = (observed / 2) - n_a * (n_a + 1) / 2
    best = smallest_p(n_a, n_b, "two-sided" if alternative == "two-sided" else "greater")
    if n_a + n_b > EXACT_RANK_SUM_MAX:
        from scipy import stats

        p = float(stats.mannwhitneyu(a, b, alternative=alternative, method="asymptotic").pvalue)
        return RankTest("Mann-Whitney (normal approximation)", n_a + n_b, u, p, best, alternative, exact=False)
    total = int(ranks.sum())
    # ways[k, s]: subsets of k of the ranks seen so far whose doubled ranks sum to s
    ways = np.zeros((n_a + 1, total + 1))
    ways[0, 0] = 1.0
    for r in ranks:
        ways[1:, r:] += ways[:-1, : total + 1 - r].copy()
    null = ways[n_a] / ways[n_a].sum()
    return RankTest(name, n_a + n_b, u, _p_from_null(null, observed, alternative), best, alternative)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the given order; NaN stays NaN and does not count."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(len(p), math.nan)
    index = [i for i in np.argsort(p, kind="mergesort") if math.isfinite(p[i])]
    m = len(index)
    running = 0.0
    for rank, i in enumerate(index):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [float(x) for x in out]


# --- intervals and the spread of differences -------------------------------------------

BOOTSTRAP_DRAWS = 10_000
BOOTSTRAP_SEED = 0
"""Fixed, so that a report is the same every time it is made."""


def mean_t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student's t interval of the mean of `values` (per-seed paired differences); None under 2 values."""
    from scipy import stats

    if len(values) < 2:
        return None
    mean = float(np.mean(values))
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return mean - half, mean + half


T_BELOW_N = 10
"""Below this many seeds an interval is Student's t (Welch's for two groups): the percentile bootstrap only
resamples the seeds seen, and with a handful of them its intervals are too narrow."""


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[tuple[float, float], str]:
    """(interval of the mean, its method: "t" below T_BELOW_N finite values, else "bootstrap")."""
    x = [v for v in values if math.isfinite(v)]
    if len(x) < T_BELOW_N:
        return (mean_t_interval(x, level) or (math.nan, math.nan)), "t"
    return bootstrap_mean_ci(x, level), "bootstrap"


def difference_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[tuple[float, float], str]:
    """(interval of mean(a) - mean(b) for unpaired groups, its method: "Welch t" when either has fewer than
    T_BELOW_N finite values, else "bootstrap")."""
    x = [v for v in a if math.isfinite(v)]
    y = [v for v in b if math.isfinite(v)]
    if min(len(x), len(y)) < T_BELOW_N:
        return welch_t_interval(x, y, level), "Welch t"
    return bootstrap_difference_ci(x, y, level), "bootstrap"


def welch_t_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Welch's t interval of mean(a) - mean(b) (unequal variances); NaN with fewer than 2 values on a side."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return (math.nan, math.nan)
    va, vb = float(np.var(a, ddof=1)) / len(a), float(np.var(b, ddof=1)) / len(b)
    difference = float(np.mean(a) - np.mean(b))
    if va + vb == 0:
        return (difference, difference)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(va + vb)
    return (difference - half, difference + half)


def bootstrap_mean_ci(
    values: Sequence[float], level: float = 0.95, draws: int = BOOTSTRAP_DRAWS
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (seeds resampled); NaN with fewer than 2 values.

    With few seeds it only resamples the seeds seen, so it is narrower than the truth: read it with n.
    """
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if len(x) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = x[rng.integers(0, len(x), (draws, len(x)))].mean(axis=1)
    tail = (1 - level) / 2
    return (float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail)))


def bootstrap_difference_ci(
    a: Sequence[float], b: Sequence[float], level: float = 0.95, draws: int = BOOTSTRAP_DRAWS
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) - mean(b), each group resampled on its own (unpaired seeds)."""
    x = np.asarray([v for v in a if math.isfinite(v)], dtype=np.float64)
    y = np.asarray([v for v in b if math.isfinite(v)], dtype=np.float64)
    if len(x) < 2 or len(y) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    diff = x[rng.integers(0, len(x), (draws, len(x)))].mean(axis=1) - y[rng.integers(0, len(y), (draws, len(y)))].mean(
        axis=1
    )
    tail = (1 - level) / 2
    return (float(np.quantile(diff, tail)), float(np.quantile(diff, 1 - tail)))


@dataclass(frozen=True)
class PairingSpread:
    """How much pairing by seed narrows the differences between two configurations."""

    n: int
    sd_paired: float
    """SD of the per-seed differences a_k - b_k."""
    sd_unpaired: float
    """SD of the difference between a seed of a and an independent seed of b: sqrt(var a + var b)."""
    correlation: float
    """Pearson r of a_k and b_k over seeds (NaN when either is constant)."""

    @property
    def ratio(self) -> float:
        """sd_paired / sd_unpaired: below 1 pairing helps; the seeds needed scale with its square."""
        return self.sd_paired / self.sd_unpaired if self.sd_unpaired > 0 else math.nan


def pairing_spread(a: Sequence[float], b: Sequence[float]) -> PairingSpread:
    """The spread of paired differences against the unpaired one, from per-seed values in seed order."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"paired values need one per seed on both sides, got {len(x)} and {len(y)}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 2:
        return PairingSpread(n, math.nan, math.nan, math.nan)
    sd_paired = float(np.std(x - y, ddof=1))
    if sd_paired <= RELATIVE_TIE * max(float(np.max(np.abs(x - y))), float(np.max(np.abs(x))), 1e-300):
        sd_paired = 0.0  # every seed moved by the same amount, but for float noise
    sd_unpaired = float(math.sqrt(np.var(x, ddof=1) + np.var(y, ddof=1)))
    correlation = float(np.corrcoef(x, y)[0, 1]) if np.ptp(x) > 0 and np.ptp(y) > 0 else math.nan
    return PairingSpread(n, sd_paired, sd_unpaired, correlation)
