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

from spikeloop.experiments.analysis.crossover import Randomisation, holm_per_run, randomisation, randomisation_p
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
    randomised: Randomisation | None = None,
) -> Simulated:
    """The analysis's verdicts over `draws` simulated runs of the design (`randomised` None: as `analyse` works
    it out; give it to run one design several times without working it out again)."""
    randomised = randomised or randomisation(plan, seed)
    values = simulate_values(plan, planted, np.random.default_rng(seed), draws)
    p = {j: randomisation_p(stats) for j, stats in randomised.statistics(values).items()}
    estimates = randomised.estimates(values)
    if randomised.outcomes < 2:  # a fixed order: nothing to permute, so nothing is ever shown
        p = {j: np.full(draws, math.nan) for j in p}
    adjusted = holm_per_run(p)
    rejected = {j: float(np.mean(adjusted[:, i] <= alpha)) for i, j in enumerate(sorted(p))}
    return Simulated(
        rejected,
        {j: float(np.mean(e)) for j, e in estimates.items()},
        float(np.mean((adjusted <= alpha).any(axis=1))),
        randomised.terms.carry_over,
        randomised.outcomes,
    )


def detectable_effect(
    plan: Schedule,
    within_culture: float,
    alpha: float = 0.05,
    power: float = POWER,
    seed: int = 0,
    randomised: Randomisation | None = None,
) -> float | None:
    """The smallest direct effect of one condition over the reference that the design shows (after Holm over
    its comparisons) in `power` of its runs; None when no effect can be shown (too few orderings to permute).

    Only the within-culture spread enters: the model takes each culture's own level out, which is what a
    design with every culture under every condition buys.
    """
    randomised = randomised or randomisation(plan, seed)
    family = len(plan.conditions) - 1
    if randomised.outcomes < 2 or 1.0 / randomised.outcomes > alpha / family:
        return None
    noise = np.random.default_rng(seed).normal(0.0, within_culture, size=(DRAWS, len(plan.blocks())))
    # Statistics are linear in the values: the signal's part is worked out once, apart from the noise's.
    signal = randomised.statistics(np.array([b.condition == 1 for b in plan.blocks()], dtype=np.float64))[1]
    noise_stats = randomised.statistics(noise)[1]  # outcomes x draws
    # Holm's first step: the one comparison with an effect is tested at alpha / family when the others are null.

    def shown(effect: float) -> float:
        return float(np.mean(randomisation_p(effect * signal + noise_stats) <= alpha / family))

    low, high = 0.0, within_culture
    while shown(high) < power:
        high *= 2
        if high > 1e6 * within_culture:
            return None
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (low, middle) if shown(middle) >= power else (middle, high)
    return high
