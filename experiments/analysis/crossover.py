"""A design's blocks analysed with the culture as the unit.

Each culture took every condition in turn (experiments/design). Three views of the same blocks:

- **The randomisation test** (decides): the contrast between two conditions is estimated by least squares with
  the culture, the period and, where the design can separate it, the condition before (first-order carry-over)
  in the model. Its null distribution is the design's own randomisation: every way the design could have dealt
  its orders to the cultures (all of them, or a seeded sample where there are too many, said so). Under the null
  that no condition changes any block, the blocks are the same whatever order a culture got, so the p-value is
  exact for these cultures with no model of their spread. A fixed order has nothing to permute: no test.
- **Per-culture differences**: each culture's mean under one condition minus its mean under the other, with the
  exact signed-rank test over cultures (the claim about cultures in general; its smallest p is 2/2^cultures).
- **The mixed model** (statsmodels MixedLM): the same fixed effects, the culture as a random intercept. Its
  Wald p-values are asymptotic and run small at a handful of cultures: reported, never deciding. Its variance
  components are the spreads (`design.spread`) the next design's plan takes.

Trials on one culture are never counted as independent units: with one culture there is no test across
cultures, and the tables say so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from spikeloop.experiments.analysis.stats import holm, signed_rank_test, smallest_signed_rank_p
from spikeloop.experiments.design.schedule import Schedule
from spikeloop.experiments.design.williams import deal_count, every_deal, random_deals

MAX_EXACT_ASSIGNMENTS = 50_000
"""Beyond this many ways to deal the orders, the randomisation test draws a seeded sample of them."""
SAMPLED_ASSIGNMENTS = 20_000


@dataclass(frozen=True)
class Blocks:
    """One value per block (its metric), with where the block sat in the design."""

    culture: np.ndarray  # index into `culture_ids`
    period: np.ndarray
    condition: np.ndarray
    value: np.ndarray
    culture_ids: list[str]

    @classmethod
    def from_schedule(cls, plan: Schedule, values: Sequence[float]) -> Blocks:
        """The schedule's blocks (in `Schedule.blocks` order) with one value each."""
        blocks = plan.blocks()
        if len(values) != len(blocks):
            raise ValueError(f"{len(values)} value(s) for {len(blocks)} block(s) of the design")
        ids = [c["culture_id"] for c in plan.cultures]
        return cls(
            culture=np.array([ids.index(b.culture_id) for b in blocks]),
            period=np.array([b.period for b in blocks]),
            condition=np.array([b.condition for b in blocks]),
            value=np.asarray(values, dtype=np.float64),
            culture_ids=ids,
        )


@dataclass(frozen=True)
class Terms:
    """What the least-squares model holds besides culture and condition."""

    period: bool
    """A fixed order confounds period with condition: there the model cannot hold both."""
    carry_over: bool
    """The condition of the block before (first-order carry-over), where the design can separate it."""


def previous_of(culture: np.ndarray, condition: np.ndarray) -> np.ndarray:
    """Each block's culture's condition in the block before (-1 for a culture's first block); blocks in
    culture-then-period order, along the last axis."""
    before = np.roll(condition, 1, axis=-1)
    first = np.r_[True, culture[1:] != culture[:-1]]
    return np.where(first, -1, before)


def model_matrices(culture: np.ndarray, period: np.ndarray, conditions: np.ndarray, k: int, terms: Terms) -> np.ndarray:
    """(outcomes x blocks x columns) for (outcomes x blocks) conditions. Columns: one per culture, one per period
    after the first, one per condition after condition 0, one per condition after 0 as the block before (the
    first block and condition 0 before it are the baseline: a culture's first block is told apart by its
    period already)."""
    fixed = [culture == c for c in range(int(culture.max()) + 1)]
    if terms.period:
        fixed += [period == p for p in range(1, int(period.max()) + 1)]
    shared = np.broadcast_to(np.column_stack(fixed), (*conditions.shape, len(fixed)))
    parts = [shared, conditions[..., None] == np.arange(1, k)]
    if terms.carry_over:
        parts.append(previous_of(culture, conditions)[..., None] == np.arange(1, k))
    return np.concatenate(parts, axis=-1).astype(np.float64)


def condition_column(n_cultures: int, n_periods: int, terms: Terms, j: int) -> int:
    return n_cultures + (n_periods - 1 if terms.period else 0) + (j - 1)


@dataclass
class Comparison:
    """Condition `a` against condition `b` (the reference) over the design's cultures."""

    a: int
    b: int
    estimate: float
    """Least-squares difference a - b, adjusted for culture, period and (where separable) carry-over."""
    randomisation_p: float
    assignments: int
    exact: bool
    per_culture: list[float]
    """Each culture's mean under a minus its mean under b (unadjusted)."""
    signed_rank_p: float
    smallest_signed_rank_p: float
    mixed_estimate: float = math.nan
    mixed_se: float = math.nan
    mixed_p: float = math.nan
    holm_p: float = math.nan


@dataclass
class Analysis:
    """A design's comparisons against its reference condition, with the spreads and the model's terms."""

    cultures: int
    carry_over_in_model: bool
    comparisons: list[Comparison]
    carry_over: dict[int, float] = field(default_factory=dict)
    """Estimated carry-over of each condition into the next block, relative to condition 0's."""
    period: list[float] = field(default_factory=list)
    """Estimated effect of each period after the first (drift, fatigue, learning across blocks)."""
    spread: dict[str, float] = field(default_factory=dict)
    """within_culture and between_culture s.d. from the mixed model (NaN where it did not fit)."""
    notes: list[str] = field(default_factory=list)


def assignments(plan: Schedule, rng: np.random.Generator) -> tuple[list[list[list[int]]], bool]:
    """The orders the design could have dealt its cultures (as williams.deal draws them): every outcome where
    there are few enough (exact), else the dealt one and a seeded sample of draws. The dealt one first.
    (orders per culture per outcome, exact?)"""
    observed = [c["sequence"] for c in plan.cultures]
    if plan.order != "williams":
        return [observed], True
    k, n, passes = len(plan.conditions), len(plan.cultures), plan.repeats
    if deal_count(k, n, passes) <= MAX_EXACT_ASSIGNMENTS:
        every = list(every_deal(k, n, passes))
        every.remove(observed)
        return [observed, *every], True
    return [observed, *random_deals(k, n, SAMPLED_ASSIGNMENTS, rng, passes)], False


def _layout(plan: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """(culture index, period) of each block, in `Schedule.blocks` order."""
    ids = [c["culture_id"] for c in plan.cultures]
    blocks = plan.blocks()
    return np.array([ids.index(b.culture_id) for b in blocks]), np.array([b.period for b in blocks])


def weights_per_assignment(plan: Schedule, orders_list: list[list[list[int]]], terms: Terms) -> dict[int, np.ndarray]:
    """For each condition j >= 1: (outcomes x blocks) weights whose product with the blocks' values is the
    least-squares estimate of j - 0 under that outcome's orders (NaN rows: not estimable there)."""
    k = len(plan.conditions)
    culture, period = _layout(plan)
    conditions = np.array([[c for order in orders for c in order] for orders in orders_list])
    x = model_matrices(culture, period, conditions, k, terms)
    pinv = np.linalg.pinv(x)  # outcomes x columns x blocks
    n_c, n_p = int(culture.max()) + 1, int(period.max()) + 1
    out = {}
    for j in range(1, k):
        column = condition_column(n_c, n_p, terms, j)
        w = pinv[:, column, :]
        reproduced = np.einsum("ab,abc->ac", w, x)  # an estimable contrast gives back its own unit vector
        target = np.zeros(x.shape[-1])
        target[column] = 1.0
        estimable = np.all(np.abs(reproduced - target) < 1e-8, axis=1)
        out[j] = np.where(estimable[:, None], w, np.nan)
    return out


def terms_for(plan: Schedule) -> Terms:
    """Period where the order was randomised; carry-over where, with period, every condition stays estimable."""
    if plan.order != "williams":
        return Terms(period=False, carry_over=False)
    with_carry = Terms(period=True, carry_over=True)
    observed = [[c["sequence"] for c in plan.cultures]]
    separable = all(np.isfinite(w).all() for w in weights_per_assignment(plan, observed, with_carry).values())
    return with_carry if separable and len(plan.conditions) > 2 else Terms(period=True, carry_over=False)


def standardised(w: np.ndarray) -> np.ndarray:
    """Each outcome's weights over their length: the test's statistic is then the estimate on one scale for every
    outcome, so an ill-conditioned deal (possible when the cultures are no multiple of the orders) cannot
    dominate the null distribution."""
    norm = np.sqrt((w**2).sum(axis=1, keepdims=True))
    return w / np.where(norm > 0, norm, np.nan)


def randomisation_p(stats: np.ndarray, dealt: np.ndarray | None = None) -> np.ndarray:
    """Two-sided p per column of (outcomes x runs) statistics: the share of the outcomes whose statistic is at least
    as far from 0 as the dealt one's, among those that are estimable. The dealt outcome is row 0, or per column
    the row `dealt` names (each run read as if that outcome had been dealt)."""
    observed = np.abs(stats[0] if dealt is None else stats[dealt, np.arange(stats.shape[1])])
    finite = np.isfinite(stats)
    extreme = (np.abs(stats) >= observed - 1e-9 * np.maximum(1.0, observed)) & finite
    return extreme.sum(axis=0) / finite.sum(axis=0)


def holm_per_run(p: dict[int, np.ndarray]) -> np.ndarray:
    """(runs x comparisons) Holm-adjusted p from each comparison's p per run (comparisons in key order)."""
    keys = sorted(p)
    return np.array([holm([p[j][run] for j in keys]) for run in range(len(p[keys[0]]))])


@dataclass(frozen=True)
class Randomisation:
    """What the test permutes over, worked out once per design: the model's terms, the outcomes the design could
    have dealt (the dealt one first) and, per condition j >= 1, each outcome's least-squares weights for j - 0."""

    terms: Terms
    outcomes: int
    exact: bool
    weights: dict[int, np.ndarray]
    orders: list[list[list[int]]]
    """Each outcome's orders, one sequence per culture (the dealt one first)."""

    def statistics(self, values: np.ndarray) -> dict[int, np.ndarray]:
        """Per condition: (outcomes x runs) standardised statistics of (runs x blocks) values."""
        return {j: standardised(w) @ np.atleast_2d(values).T for j, w in self.weights.items()}

    def estimates(self, values: np.ndarray) -> dict[int, np.ndarray]:
        """Per condition: the dealt outcome's least-squares estimate of j - 0 for each run of (runs x blocks)."""
        return {j: w[0] @ np.atleast_2d(values).T for j, w in self.weights.items()}


def randomisation(plan: Schedule, seed: int = 0, terms: Terms | None = None) -> Randomisation:
    """The design's randomisation (`terms` None: the terms `analyse` fits; `seed`: the sample, where there is one)."""
    terms = terms or terms_for(plan)
    orders_list, exact = assignments(plan, np.random.default_rng(seed))
    weights = weights_per_assignment(plan, orders_list, terms)
    return Randomisation(terms, len(orders_list), exact, weights, orders_list)


def analyse(plan: Schedule, blocks: Blocks, alpha: float = 0.05, seed: int = 0) -> Analysis:
    """Every condition against condition 0 (the grid's first), Holm over that family; `blocks` in
    `Schedule.blocks` order (Blocks.from_schedule)."""
    k = len(plan.conditions)
    n_cultures = len(blocks.culture_ids)
    randomised = randomisation(plan, seed)
    terms = randomised.terms
    notes: list[str] = []
    if plan.order == "fixed":
        notes.append(
            "a fixed order deals nothing at random: no randomisation test, and each estimate holds the drift "
            "over periods and the carry-over of the block before as well as the condition's own effect"
        )
    elif not terms.carry_over:
        notes.append(f"first-order carry-over cannot be told apart from {k} conditions' effects: estimates assume none")
    if n_cultures < 2:
        notes.append("one culture: no test across cultures; its blocks are repeated measures of one dish")
    statistics = randomised.statistics(blocks.value)
    estimates = randomised.estimates(blocks.value)
    comparisons = []
    for j in range(1, k):
        stats = statistics[j][:, 0]
        tested = randomised.outcomes > 1 and bool(np.isfinite(stats[0]))
        per_culture = _per_culture(blocks, j, 0)
        rank = signed_rank_test(per_culture) if len(per_culture) > 1 else None
        comparisons.append(
            Comparison(
                a=j,
                b=0,
                estimate=float(estimates[j][0]),
                randomisation_p=float(randomisation_p(stats[:, None])[0]) if tested else math.nan,
                assignments=randomised.outcomes,
                exact=randomised.exact,
                per_culture=per_culture,
                signed_rank_p=rank.p if rank is not None else math.nan,
                smallest_signed_rank_p=smallest_signed_rank_p(n_cultures),
            )
        )
    for comparison, adjusted in zip(comparisons, holm([c.randomisation_p for c in comparisons]), strict=True):
        comparison.holm_p = adjusted
    analysis = Analysis(n_cultures, terms.carry_over, comparisons, notes=notes)
    _least_squares_terms(analysis, plan, blocks, terms)
    _mixed_model(analysis, blocks, terms)
    return analysis


def _per_culture(blocks: Blocks, a: int, b: int) -> list[float]:
    out = []
    for c in range(len(blocks.culture_ids)):
        mine = blocks.culture == c
        ya, yb = blocks.value[mine & (blocks.condition == a)], blocks.value[mine & (blocks.condition == b)]
        if len(ya) and len(yb):
            out.append(float(ya.mean() - yb.mean()))
    return out


def _least_squares_terms(analysis: Analysis, plan: Schedule, blocks: Blocks, terms: Terms) -> None:
    """Period effects and carry-over estimates (relative to the first period and to condition 0)."""
    k = len(plan.conditions)
    x = model_matrices(blocks.culture, blocks.period, blocks.condition[None, :], k, terms)[0]
    beta, *_ = np.linalg.lstsq(x, blocks.value, rcond=None)
    n_c, n_p = len(blocks.culture_ids), int(blocks.period.max()) + 1
    if terms.period:
        analysis.period = [float(v) for v in beta[n_c : n_c + n_p - 1]]
    if terms.carry_over:
        start = condition_column(n_c, n_p, terms, k)  # the column after the last condition's
        analysis.carry_over = {j: float(beta[start + j - 1]) for j in range(1, k)}


def _mixed_model(analysis: Analysis, blocks: Blocks, terms: Terms) -> None:
    """statsmodels MixedLM: the culture as a random intercept; its estimates, Wald p and variance components."""
    if analysis.cultures < 2:
        return
    import pandas as pd
    import statsmodels.formula.api as smf

    frame = pd.DataFrame(
        {
            "value": blocks.value,
            "culture": blocks.culture,
            "period": blocks.period,
            "condition": blocks.condition,
            # The same baseline as model_matrices: no block before and condition 0 before are one level.
            "before": np.clip(previous_of(blocks.culture, blocks.condition), 0, None),
        }
    )
    formula = "value ~ C(condition)" + (" + C(period)" if terms.period else "")
    formula += " + C(before)" if terms.carry_over else ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter: `converged` is read below and said in a note
        try:
            fit = smf.mixedlm(formula, frame, groups=frame["culture"]).fit(reml=True)
        except (ValueError, np.linalg.LinAlgError) as exc:
            analysis.notes.append(f"the mixed model did not fit: {exc}")
            return
    if not fit.converged:
        analysis.notes.append("the mixed model did not converge: its figures are shown but not to be trusted")
    for comparison in analysis.comparisons:
        name = f"C(condition)[T.{comparison.a}]"
        if name in fit.params.index:
            comparison.mixed_estimate = float(fit.params[name])
            comparison.mixed_se = float(fit.bse[name])
            comparison.mixed_p = float(fit.pvalues[name])
    between = float(fit.cov_re.iloc[0, 0]) if fit.cov_re.size else math.nan
    analysis.spread = {
        "within_culture": math.sqrt(max(float(fit.scale), 0.0)),
        "between_culture": math.sqrt(max(between, 0.0)),
    }


def lines(plan: Schedule, analysis: Analysis, alpha: float = 0.05) -> list[str]:
    """The analysis as text: one line per comparison, then the model's terms and the notes."""
    out = [f"cultures: {analysis.cultures} (the unit); blocks: {len(plan.blocks())}"]
    for c in analysis.comparisons:
        test = (
            f"randomisation p {c.randomisation_p:.4g} (Holm {c.holm_p:.4g}; "
            f"{'all' if c.exact else 'a sample of'} {c.assignments:,} orderings)"
            if math.isfinite(c.randomisation_p)
            else "no randomisation test"
        )
        verdict = "differs" if math.isfinite(c.holm_p) and c.holm_p <= alpha else "not shown to differ"
        out.append(
            f"  {plan.conditions[c.a].label}  vs  {plan.conditions[c.b].label}: {c.estimate:+.4g}, {test}: {verdict}"
        )
        if analysis.cultures > 1:
            out.append(
                f"    per culture {', '.join(f'{d:+.3g}' for d in c.per_culture)}; signed-rank over cultures "
                f"p {c.signed_rank_p:.4g} (smallest possible {c.smallest_signed_rank_p:.3g}); mixed model "
                f"{c.mixed_estimate:+.4g} +- {c.mixed_se:.3g}, Wald p {c.mixed_p:.3g} (asymptotic, not deciding)"
            )
    if analysis.period:
        out.append("  period effects (vs the first block): " + ", ".join(f"{v:+.3g}" for v in analysis.period))
    if analysis.carry_over:
        out.append(
            "  carry-over into the next block (vs condition 0's): "
            + ", ".join(f"{plan.conditions[j].label}: {v:+.3g}" for j, v in analysis.carry_over.items())
        )
    if analysis.spread:
        out.append(
            f"  spread: within_culture {analysis.spread['within_culture']:.3g}, "
            f"between_culture {analysis.spread['between_culture']:.3g} (design.spread for the next plan)"
        )
    out += [f"  note: {note}" for note in analysis.notes]
    return out
