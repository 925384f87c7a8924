"""What `spikeloop check` says about a design before it runs: the schedule, the device time, what it can show."""

from __future__ import annotations

from spikeloop.experiments.analysis.crossover import Randomisation, randomisation
from spikeloop.experiments.design.schedule import Schedule, balance_line, schedule, timing
from spikeloop.experiments.design.simulate import POWER, Planted, detectable_effect, run
from spikeloop.experiments.protocol.settings import tick_s

ALPHA = 0.05
VALIDATION_RUNS = 400
"""Made-up runs of the design `check` analyses: enough to tell an error rate of 5% from one of 10%."""
SHOWN_CULTURES = 24
"""Cultures listed one per line; the rest are counted."""


def design_schedule(experiment) -> Schedule:
    """The experiment's design as it will run (simulated devices named, so their cultures get culture seeds)."""
    assert experiment.design is not None
    return schedule(experiment.design, simulated_devices(experiment))


def simulated_devices(experiment) -> set[str]:
    return {d.device_id for d in experiment.devices if d.simulated}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def lines(experiment) -> list[str]:
    design = experiment.design
    plan = design_schedule(experiment)
    k = len(plan.conditions)
    blocks = design.blocks_per_culture()
    out = [
        f"design: {len(plan.cultures)} culture(s) x {k} conditions x {design.repeats} pass(es) = "
        f"{blocks * len(plan.cultures)} blocks; the culture is the unit (order {design.order}, seed {design.seed})"
    ]
    out += [f"  C{c.index}: {c.label}" for c in plan.conditions]
    for culture in plan.cultures[:SHOWN_CULTURES]:
        seed = f" (culture seed {culture['culture_seed']})" if culture["culture_seed"] is not None else ""
        order = " > ".join(f"C{c}" for c in culture["sequence"])
        out.append(f"  {culture['culture_id']} on {culture['device']}{seed}: {order}")
    if len(plan.cultures) > SHOWN_CULTURES:
        out.append(f"  ... and {len(plan.cultures) - SHOWN_CULTURES} more culture(s)")
    out.append("  " + balance_line(plan))
    rounds = experiment.model.same_frame_rounds
    exchange_s = tick_s(experiment.devices)
    span = timing(design, exchange_s, rounds, simulated_devices(experiment))
    budget = (
        f"{design.block_env_steps:,} env steps"
        if design.block_env_steps is not None
        else f"{design.block_minutes:g} min"
    )
    out.append(
        f"  each block: {budget} = {span.block_s / 60:.1f} min of culture time ({exchange_s * 1000:.0f} ms per "
        f"exchange); {design.rest_s:g} s rest between blocks; fresh each block: {design.fresh}; the culture carries over"
    )
    out.append(
        f"  culture time: {_hours(span.per_culture_s)} per culture; {span.device_hours:.1f} device-hours in all; "
        f"{_hours(span.wall_s)} with the devices side by side (the cultures on one device take turns)"
    )
    randomised = randomisation(plan)
    out.append("  " + _detectable_line(plan, experiment, randomised))
    out.append("  " + _validation_line(plan, experiment, randomised))
    return out


def _validation_line(plan: Schedule, experiment, randomised: Randomisation) -> str:
    """The design and its analysis on made-up blocks: the null's error rate and what a carry-over does."""
    spread = experiment.design.spread
    sd = spread.within_culture if spread is not None else 1.0
    k = len(plan.conditions)
    null = run(plan, Planted([0.0] * k, within_culture=sd), ALPHA, VALIDATION_RUNS, randomised=randomised)
    carried = run(
        plan,
        Planted([0.0] * k, carry_over=[0.0, sd] + [0.0] * (k - 2), within_culture=sd),
        ALPHA,
        VALIDATION_RUNS,
        randomised=randomised,
    )
    bias = max(abs(v) for v in carried.mean_estimate.values()) / sd
    tested = (
        f"with nothing planted, a comparison came out significant in {null.family_wise:.1%} of them (alpha {ALPHA:g})"
        if null.assignments > 1
        else "nothing can come out significant (no randomisation to test by)"
    )
    return (
        f"checked on {VALIDATION_RUNS} made-up runs of this design: {tested}; a carry-over of one s.d. from C1 "
        f"into the next block moves an estimate by {bias:.2f} s.d. at most"
        + (" (the order confounds it)" if plan.order == "fixed" else " (the model takes it out)" if bias < 0.2 else "")
    )


def _detectable_line(plan: Schedule, experiment, randomised: Randomisation) -> str:
    spread = experiment.design.spread
    family = len(plan.conditions) - 1
    if spread is None:
        return (
            "smallest effect it can show: give design.spread (within_culture, between_culture: `spikeloop analyze` "
            "prints them for a pilot design) to see it"
        )
    effect = detectable_effect(plan, spread.within_culture, ALPHA, randomised=randomised)
    what = f"{POWER:.0%} power at alpha {ALPHA} (Holm over {family} comparison(s) against C0, randomisation test)"
    if effect is None:
        return (
            f"smallest effect it can show: none: {len(plan.cultures)} culture(s) give too few orderings for a "
            f"randomisation p below {ALPHA / family:.3g}; add cultures"
            + (f" ({_cultures_needed(plan, experiment)})" if plan.order == "williams" else "")
        )
    return (
        f"smallest effect it can show with {what}: {effect:.3g} in the metric's units "
        f"({effect / spread.within_culture:.2f} within-culture s.d.; the between-culture spread cancels, as every "
        "culture takes every condition)"
    )


def _cultures_needed(plan: Schedule, experiment) -> str:
    """The fewest cultures (whole sets of orders) at which an effect can be shown at all."""
    design = experiment.design
    rows = len(plan.rows)
    for sets in range(1, 9):
        count = rows * sets
        if count <= len(plan.cultures):
            continue
        cultures = [{"culture_id": f"c{i}", "device": design.cultures[0].device} for i in range(count)]
        bigger = type(design).model_validate({**design.model_dump(), "cultures": cultures})
        trial = schedule(bigger, simulated_devices(experiment))
        if detectable_effect(trial, design.spread.within_culture, ALPHA) is not None:
            return f"{count} cultures can"
    return f"more than {rows * 8} cultures"
