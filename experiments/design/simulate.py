"""A design run on made-up blocks: what its analysis finds when the truth is planted.

Each block's value is the culture's own level (between-culture spread), plus its condition's direct effect,
plus the carry-over of the condition of the block before, plus a drift per period, plus the block's own noise
(within-culture spread). Run many times, the randomisation test of experiments/analysis/crossover.py then
gives the design's power at a planted effect, its false-positive rate under the null, and the bias a
carry-over leaves in each kind of order. `spikeloop check` takes the smallest effect the design detects from
here. Cultures on a real device, or simulated ones, are the test of the whole loop; this is the test of the
design and its analysis, and is fast enough to run before every plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spikeloop.experiments.analysis.crossover import (
    Terms,
    assignments,
    randomisation_p,
    standardised,
    terms_for,
    weights_per_assignment,
)
from spikeloop.experiments.analysis.stats import holm
from spikeloop.experiments.design.schedule import Schedule

POWER = 0.8
DRAWS = 400


@dataclass(frozen=True)
class Planted:
    """The truth a simulated design is run under (values in the metric's units)."""

    effects: Sequence[float]
    """Direct effect of each condition (condition 0's is the reference)."""
    carry_over: Sequence[float] = ()
    """What each condition adds to the culture's next block (empty: none)."""
    drift_per_period: float = 0.0
    within_culture: float = 1.0
    between_culture: float = 0.0


def planted_mean(plan: Schedule, planted: Planted) -> np.ndarray:
    """Each block's expected value (no noise), in `Schedule.blocks` order."""
    carry = list(planted.carry_over) or [0.0] * len(plan.conditions)
    return np.array(
        [
            planted.effects[b.condition]
            + (carry[b.previous] if b.previous is not None else 0.0)
            + planted.drift_per_period * b.period
            for b in plan.blocks()
        ]
    )


def simulate_values(plan: Schedule, planted: Planted, rng: np.random.Generator, draws: int) -> np.ndarray:
    """`draws` simulated designs: (draws x blocks) values."""
    blocks = plan.blocks()
    ids = [c["culture_id"] for c in plan.cultures]
    culture = np.array([ids.index(b.culture_id) for b in blocks])
    level = rng.normal(0.0, planted.between_culture, size=(draws, len(ids)))[:, culture]
    noise = rng.normal(0.0, planted.within_culture, size=(draws, len(blocks)))
    return planted_mean(plan, planted)[None, :] + level + noise


@dataclass(frozen=True)
class Simulated:
    """What the analysis found over many simulated runs of one design."""

    rejected: dict[int, float]
    """Per condition j >= 1: the share of runs in which j vs 0 was significant after Holm."""
    mean_estimate: dict[int, float]
    """Per condition j >= 1: the mean least-squares estimate of j - 0 (compare with the planted difference)."""
    family_wise: float
    """The share of runs in which any comparison was significant after Holm (under the null: the error rate)."""
    carry_over_in_model: bool
    assignments: int


def run(
    plan: Schedule,
    planted: Planted,
    alpha: float = 0.05,
    draws: int = DRAWS,
    seed: int = 0,
    terms: Terms | None = None,
) -> Simulated:
    """The analysis's verdicts over `draws` simulated runs of the design (terms None: as `analyse` fits)."""
    rng = np.random.default_rng(seed)
    terms = terms or terms_for(plan)
    orders_list, _ = assignments(plan, rng)
    weights = weights_per_assignment(plan, orders_list, terms)
    values = simulate_values(plan, planted, rng, draws)
    p = {j: np.array([randomisation_p(s) for s in (standardised(w) @ values.T).T]) for j, w in weights.items()}
    estimates = {j: w[0] @ values.T for j, w in weights.items()}
    if len(orders_list) < 2:  # a fixed order: nothing to permute, so nothing is ever shown
        p = {j: np.full(draws, math.nan) for j in weights}
    adjusted = np.array([holm([p[j][d] for j in sorted(p)]) for d in range(draws)])
    rejected = {j: float(np.mean(adjusted[:, i] <= alpha)) for i, j in enumerate(sorted(p))}
    return Simulated(
        rejected,
        {j: float(np.mean(e)) for j, e in estimates.items()},
        float(np.mean((adjusted <= alpha).any(axis=1))),
        terms.carry_over,
        len(orders_list),
    )


def detectable_effect(
    plan: Schedule, within_culture: float, alpha: float = 0.05, power: float = POWER, seed: int = 0
) -> float | None:
    """The smallest direct effect of one condition over the reference that the design shows (after Holm over
    its comparisons) in `power` of its runs; None when no effect can be shown (too few orderings to permute).

    Only the within-culture spread enters: the model takes each culture's own level out, which is what a
    design with every culture under every condition buys.
    """
    rng = np.random.default_rng(seed)
    orders_list, _ = assignments(plan, rng)
    if len(orders_list) < 2:
        return None
    k = len(plan.conditions)
    family = k - 1
    if 1.0 / len(orders_list) > alpha / family:
        return None
    w = standardised(weights_per_assignment(plan, orders_list, terms_for(plan))[1])
    noise = rng.normal(0.0, within_culture, size=(DRAWS, w.shape[1]))
    signal = w @ (np.array([b.condition == 1 for b in plan.blocks()], dtype=np.float64))
    noise_stats = w @ noise.T  # assignments x draws
    # Holm's first step: the one comparison with an effect is tested at alpha / family when the others are null.

    def shown(effect: float) -> float:
        stats = effect * signal[:, None] + noise_stats
        p = np.mean(np.abs(stats) >= np.abs(stats[0])[None, :] - 1e-12, axis=0)
        return float(np.mean(p <= alpha / family))

    low, high = 0.0, within_culture
    while shown(high) < power:
        high *= 2
        if high > 1e6 * within_culture:
            return None
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (low, middle) if shown(middle) >= power else (middle, high)
    return high
