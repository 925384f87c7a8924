"""The sweep analysis' exact tests, Holm, intervals and pairing spread; the power simulation and its table.

The exact tests are checked against scipy where scipy is exact (no ties) and against brute-force
enumeration of the permutation distribution where values tie; the power simulation against the
normal approximation where that is accurate (many seeds) and against the exact floor where it is
not (few seeds). The power table in docs/benchmarks.md must be what the function computes from
docs/benchmarks/learning.json.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spikeloop.experiments.analysis import power, power_table, stats

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


@pytest.mark.parametrize("n", [3, 6, 11])
@pytest.mark.parametrize("alternative", stats.SIDES)
def test_signed_rank_is_scipys_exact_test_without_ties(n: int, alternative: str) -> None:
    d = np.random.default_rng(n).normal(0.4, 1.0, n)
    expected = scipy_stats.wilcoxon(d, alternative=alternative, method="exact").pvalue
    assert stats.signed_rank_test(d, alternative).p == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("sizes", [(3, 3), (4, 6), (7, 5)])
@pytest.mark.parametrize("alternative", stats.SIDES)
def test_rank_sum_is_scipys_exact_test_without_ties(sizes: tuple[int, int], alternative: str) -> None:
    rng = np.random.default_rng(sum(sizes))
    a, b = rng.normal(0.5, 1, sizes[0]), rng.normal(0, 1, sizes[1])
    expected = scipy_stats.mannwhitneyu(a, b, alternative=alternative, method="exact").pvalue
    assert stats.rank_sum_test(a, b, alternative).p == pytest.approx(expected, abs=1e-12)


def _brute_signed_rank(d: list[float]) -> float:
    """Two-sided p by listing every sign assignment of the non-zero differences' mid-ranks."""
    d = [x for x in d if x != 0]
    ranks = scipy_stats.rankdata(np.abs(d))
    observed = sum(r for r, x in zip(ranks, d, strict=True) if x > 0)
    centre = ranks.sum() / 2
    sums = [
        sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in itertools.product([0, 1], repeat=len(d))
    ]
    return sum(abs(s - centre) >= abs(observed - centre) - 1e-9 for s in sums) / len(sums)


def _brute_rank_sum(a: list[float], b: list[float]) -> float:
    """Two-sided p by listing every way of choosing len(a) of the pooled mid-ranks."""
    ranks = scipy_stats.rankdata(np.concatenate([a, b]))
    observed = ranks[: len(a)].sum()
    centre = len(a) * ranks.mean()
    sums = [ranks[list(c)].sum() for c in itertools.combinations(range(len(ranks)), len(a))]
    return sum(abs(s - centre) >= abs(observed - centre) - 1e-9 for s in sums) / len(sums)


def test_ties_and_zeros_are_exact() -> None:
    d = [2.0, 2.0, -1.0, 0.0, 3.0, 2.0, -3.0]
    assert stats.signed_rank_test(d).p == pytest.approx(_brute_signed_rank(d))
    assert stats.signed_rank_test(d).n == 6  # the zero carries no sign
    a, b = [1.0, 1.0, 2.0, 0.5], [1.0, 0.0, 0.0, 2.0, 0.5]
    assert stats.rank_sum_test(a, b).p == pytest.approx(_brute_rank_sum(a, b))
    assert stats.signed_rank_test([0.0, 0.0, 0.0]).p == 1.0  # identical configurations: nothing to test
    assert stats.rank_sum_test([1.0, 1.0], [1.0, 1.0]).p == 1.0


def _brute_rank_sum_greater(a: list[float], b: list[float]) -> float:
    """One-sided p (a higher) by listing every way of choosing len(a) of the pooled mid-ranks."""
    ranks = scipy_stats.rankdata(np.concatenate([a, b]))
    observed = ranks[: len(a)].sum()
    sums = [ranks[list(c)].sum() for c in itertools.combinations(range(len(ranks)), len(a))]
    return sum(s >= observed - 1e-9 for s in sums) / len(sums)


def test_compare_is_exact_when_finals_tie() -> None:
    """`compare` (bench learning, bench feedback) counts the tied ranks' null, not the normal approximation."""
    # The shape of the defend_the_center run: two of a's seeds tie, one pair is reversed.
    a = [-349.3, -348.1, -348.1, -323.0, -339.0]
    b = [-361.0, -388.0, -391.0, -373.0, -349.2]
    c = stats.compare("a", a, "b", b)
    assert c.mann_whitney_p == pytest.approx(_brute_rank_sum_greater(a, b)) == pytest.approx(2 / 252)
    assert c.mann_whitney_exact
    approximate = scipy_stats.mannwhitneyu(a, b, alternative="greater", method="asymptotic").pvalue
    assert approximate > 0.01 > c.mann_whitney_p  # what the approximation used to decide
    kills_a, kills_b = [1.0, 1.0, 0.99, 1.0, 1.0], [0.97, 0.98, 0.97, 0.99, 0.96]  # ties at 1.00, a tie across groups
    two = stats.compare("a", kills_a, "b", kills_b, "two-sided").mann_whitney_p
    assert two == pytest.approx(_brute_rank_sum(kills_a, kills_b))
    assert stats.compare("a", kills_a, "b", kills_b).mann_whitney_p == pytest.approx(
        _brute_rank_sum_greater(kills_a, kills_b)
    )


def test_differences_of_float_noise_are_zero() -> None:
    noise = [100.0, 100.0 + 1e-13, 100.0 - 2e-13, 100.0]
    assert stats.signed_rank_test(noise).p == pytest.approx(2 / 2**4)  # all tied: as far as 4 seeds go
    assert stats.pairing_spread([1.0 + 1e-15, 2.0, 3.0], [0.0, 1.0, 2.0]).sd_paired == 0.0


def test_smallest_p_and_the_seeds_a_claim_needs() -> None:
    for n in (3, 5, 6, 8):
        assert stats.signed_rank_test([1.0 + i for i in range(n)]).p == pytest.approx(2 / 2**n)
        assert stats.signed_rank_test([1.0 + i for i in range(n)]).smallest_p == pytest.approx(2 / 2**n)
    assert stats.min_paired_seeds(0.05) == 6  # 2/32 = 0.0625 with 5
    assert stats.min_paired_seeds(0.05, "greater") == 5  # 1/32
    assert stats.min_paired_seeds(0.01) == 8  # 2/256
    assert stats.rank_sum_test([5, 6, 7, 8], [1, 2, 3, 4]).smallest_p == pytest.approx(2 / 70)


def test_holm() -> None:
    # step-down: sorted 0.01, 0.03, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert stats.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    adjusted = stats.holm([0.2, math.nan, 0.001])
    assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.002)
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]  # 2 x 0.8 capped at 1, and never below the step before


def test_intervals_and_pairing_spread() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    lo, hi = stats.bootstrap_mean_ci(values)
    assert lo < np.mean(values) < hi and (lo, hi) == stats.bootstrap_mean_ci(values)  # fixed seed: repeatable
    assert all(math.isnan(x) for x in stats.bootstrap_mean_ci([1.0]))
    seed_effect = np.array([0.0, 50.0, -30.0, 20.0, 80.0])
    a, b = seed_effect + 10 + np.array([1, -1, 0, 1, -1]), seed_effect
    spread = stats.pairing_spread(a, b)
    assert spread.sd_paired == pytest.approx(np.std(a - b, ddof=1))
    assert spread.sd_unpaired == pytest.approx(math.sqrt(np.var(a, ddof=1) + np.var(b, ddof=1)))
    assert spread.ratio < 0.05 and spread.correlation > 0.99
    with pytest.raises(ValueError, match="one per seed"):
        stats.pairing_spread([1.0, 2.0], [1.0])


# --- power ------------------------------------------------------------------------------------


def test_no_power_below_the_exact_floor() -> None:
    assert power.simulated_power(5, 1e6, 1.0, paired=True, alpha=0.05) == 0.0  # 2/32 > 0.05 whatever the data
    assert power.simulated_power(6, 1e6, 1.0, paired=True, alpha=0.05) == 1.0
    assert power.detectable_difference(5, 1.0, paired=True, alpha=0.05) == math.inf
    assert power.min_seeds(0.05, paired=True) == 6 and power.min_seeds(0.05, paired=False) == 4


def test_power_matches_the_normal_approximation_with_many_seeds() -> None:
    """At 40 seeds the rank tests behave like z tests on 3/pi as many seeds (their efficiency on normal data)."""
    z = scipy_stats.norm.ppf(0.975)
    for paired, n, sd in ((True, 40, 1.0), (False, 40, 1.0)):
        effective = n * 3 / math.pi / (1 if paired else 2)
        expected = scipy_stats.norm.cdf(0.5 / sd * math.sqrt(effective) - z)
        assert power.simulated_power(n, 0.5, sd, paired=paired, alpha=0.05) == pytest.approx(expected, abs=0.03)


def test_seeds_needed_and_detectable_difference_agree() -> None:
    for paired in (True, False):
        n = power.seeds_needed(25.0, 25.9, paired=paired, alpha=0.05)
        assert n is not None and power.simulated_power(n, 25.0, 25.9, paired=paired, alpha=0.05) >= 0.8
        assert power.simulated_power(n - 1, 25.0, 25.9, paired=paired, alpha=0.05) < 0.8
        assert power.detectable_difference(n, 25.9, paired=paired, alpha=0.05) <= 25.0
        assert power.detectable_difference(n - 1, 25.9, paired=paired, alpha=0.05) > 25.0
    assert power.seeds_needed(0.01, 25.9, paired=False, alpha=0.05) is None  # more than MAX_SEEDS


def test_the_benchmark_spread_is_read_from_its_seeds() -> None:
    spread = power_table.benchmark_spread(power_table.LEARNING_JSON, "sim")
    ret = spread["final_return"]
    assert ret["partners"] == ["zero", "random"] and ret["seeds"] == 5
    assert 10 < ret["sd"] < 60 and 5 < ret["sd_paired"] < 60
    assert power_table.benchmark_spread(power_table.LEARNING_JSON, "direct")["final_return"]["sd_paired"] is None


def test_docs_power_table_is_the_functions(tmp_path: Path) -> None:
    """docs/benchmarks.md's table is `spikeloop analyze --power` on docs/benchmarks/learning.json, unedited."""
    table = power_table.power_table_markdown()
    assert power_table.docs_table(DOCS) == table, (
        "regenerate: spikeloop analyze --power --update-docs docs/benchmarks.md"
    )
    copy = tmp_path / "benchmarks.md"
    copy.write_text(f"text\n{power_table.DOCS_BEGIN}\nold\n{power_table.DOCS_END}\nmore\n")
    assert power_table.update_docs(copy, table) and power_table.docs_table(copy) == table
    assert not power_table.update_docs(copy, table)
    assert copy.read_text().startswith("text\n") and copy.read_text().endswith("more\n")


def test_intervals_are_t_below_ten_seeds_and_bootstrap_from_there() -> None:
    """With a handful of seeds the percentile bootstrap only resamples what it saw and runs narrow: below 10 the
    interval is Student's t (Welch's for two groups); the method goes with it."""
    few = [3.0, -1.0, 4.0, 1.0, 5.0, -2.0, 6.0, 2.0]
    (low, high), method = stats.mean_interval(few)
    assert method == "t" and (low, high) == pytest.approx(stats.mean_t_interval(few))
    narrow = stats.bootstrap_mean_ci(few)
    assert low < narrow[0] and high > narrow[1]  # the bootstrap's is narrower at 8 seeds
    many = few + [0.0, 7.0, -3.0]
    assert stats.mean_interval(many) == (stats.bootstrap_mean_ci(many), "bootstrap")

    other = [v + 2.0 for v in few[:6]]
    (low, high), method = stats.difference_interval(few, other)
    reference = scipy_stats.ttest_ind(few, other, equal_var=False).confidence_interval(0.95)
    assert method == "Welch t" and (low, high) == pytest.approx((reference.low, reference.high))
    assert stats.difference_interval(many, many)[1] == "bootstrap"
