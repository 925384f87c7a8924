"""The design and its analysis, validated on planted truths (experiments/design/simulate.py).

A planted effect is found at the power the plan promised; a planted carry-over biases a fixed order and not a
balanced one; with nothing planted, the family-wise error stays at alpha. These are the design-level checks of
the method (fast: made-up block values); the loop itself is tested against simulated cultures elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spikeloop.experiments.analysis.crossover import Blocks, Terms, analyse, lines, randomisation
from spikeloop.experiments.design.schedule import schedule
from spikeloop.experiments.design.settings import DesignSection
from spikeloop.experiments.design.simulate import Planted, detectable_effect, run, simulate_values
from spikeloop.experiments.design.williams import deal_count

DRAWS = 1000


def _plan(order: str = "williams", cultures: int = 8, seed: int = 3):
    return schedule(
        DesignSection(
            order=order,
            seed=seed,
            cultures=[{"culture_id": f"dish-{i}", "device": "cl1-a"} for i in range(cultures)],
            conditions={"feedback.enabled": [True, False], "feedback.surprise.enabled": [True, False]},
            block_env_steps=2048,
        )
    )


def _mc_margin(rate: float, draws: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / draws)


def test_a_planted_effect_is_found_at_the_planned_power():
    plan = _plan()
    effect = detectable_effect(plan, within_culture=1.0)
    assert effect is not None and 1.0 < effect < 4.0
    found = run(plan, Planted(effects=[0, effect, 0, 0], between_culture=3.0, drift_per_period=0.5), draws=DRAWS)
    assert found.rejected[1] >= 0.8 - _mc_margin(0.8, DRAWS)
    assert found.mean_estimate[1] == pytest.approx(effect, abs=0.1)
    # Half the effect is found far less often: the power is the effect's, not a test that always says yes.
    half = run(plan, Planted(effects=[0, effect / 2, 0, 0]), draws=DRAWS)
    assert half.rejected[1] < 0.5


def test_a_planted_carry_over_biases_a_fixed_order_and_not_a_balanced_one():
    # Condition 1 leaves +2 in the culture's next block; no condition has an effect of its own.
    planted = Planted(effects=[0, 0, 0, 0], carry_over=[0, 2.0, 0, 0])
    balanced = run(_plan("williams"), planted, draws=DRAWS)
    fixed = run(_plan("fixed"), planted, draws=DRAWS)
    assert balanced.carry_over_in_model
    assert all(abs(v) < 0.1 for v in balanced.mean_estimate.values())
    # In the fixed order C1 always comes just before C2: C2 takes C1's carry-over as its own effect.
    assert fixed.mean_estimate[2] == pytest.approx(2.0, abs=0.1)
    assert fixed.rejected == {1: 0.0, 2: 0.0, 3: 0.0}  # and nothing can be tested: no randomisation
    # Balanced orders need the carry-over term too: without it the balance only spreads the bias.
    plan = _plan("williams")
    without = run(
        plan, planted, draws=DRAWS, randomised=randomisation(plan, terms=Terms(period=True, carry_over=False))
    )
    assert without.mean_estimate[1] == pytest.approx(-0.5, abs=0.1)


@pytest.mark.parametrize(
    "planted", [Planted([0, 0, 0, 0]), Planted([0, 0, 0, 0], between_culture=5, drift_per_period=2)]
)
def test_with_nothing_planted_the_family_wise_error_stays_at_alpha(planted):
    null = run(_plan(), planted, draws=2 * DRAWS, seed=9)
    assert null.family_wise <= 0.05 + _mc_margin(0.05, 2 * DRAWS)
    assert null.family_wise > 0.0  # a test that never rejects would pass the line above too


def test_the_analysis_of_one_design_reads_its_planted_truth():
    plan = _plan()
    planted = Planted(effects=[0, 6.0, 0, 0], carry_over=[0, 0, 1.0, 0], drift_per_period=0.5, between_culture=3)
    values = simulate_values(plan, planted, np.random.default_rng(1), 1)[0]
    analysis = analyse(plan, Blocks.from_schedule(plan, values))
    first = analysis.comparisons[0]
    assert first.holm_p <= 0.05 and first.exact and first.assignments == 13824
    assert all(c.holm_p > 0.05 for c in analysis.comparisons[1:])
    assert analysis.carry_over[2] == pytest.approx(1.0, abs=1.0)
    assert analysis.period == pytest.approx([0.5, 1.0, 1.5], abs=1.0)
    assert analysis.spread["between_culture"] > analysis.spread["within_culture"]
    text = "\n".join(lines(plan, analysis))
    assert "differs" in text and "mixed model" in text and "carry-over into the next block" in text


def test_one_culture_is_never_taken_for_many():
    plan = _plan(cultures=1)
    values = simulate_values(plan, Planted([0, 5, 0, 0]), np.random.default_rng(0), 1)[0]
    analysis = analyse(plan, Blocks.from_schedule(plan, values))
    assert any("one culture: no test across cultures" in note for note in analysis.notes)
    assert all(math.isnan(c.signed_rank_p) and math.isnan(c.mixed_p) for c in analysis.comparisons)
    # The randomisation test still speaks of this dish's blocks, over the orders it could have had.
    assert all(c.assignments == deal_count(4, 1) for c in analysis.comparisons)
