"""The `design:` section of an experiment: cultures as the units, each taking every condition in turn.

On a CL1 every block of a sweep runs on the same dish, one after another, and each block leaves something in the
culture for the next. So the unit of the experiment is the culture, not the seed: each culture (a dish, with a
`culture_id` that stays its own across recording days) takes the conditions in an order of its own, balanced
over the cultures for first-order carry-over (williams.py), with a rest between blocks. What a block leaves in
the learner can be wiped (`fresh: learner`, the default: each block trains a new agent); what it leaves in the
culture cannot, and the analysis estimates it (experiments/analysis/crossover.py).

    design:
      order: williams            # or fixed: every culture the same order (confounds order with condition)
      seed: 7                    # which culture gets which order; recorded in the schedule
      cultures:
        - {culture_id: dish-0412, device: cl1-a}
        - {culture_id: dish-0413, device: cl1-b}
      conditions:                # a grid over experiment keys, as tune.search_space's grid
        feedback.enabled: [true, false]
      block_env_steps: 2048      # each block's budget (or block_minutes of culture time)
      rest_s: 300                # between blocks: no stimulation, activity recorded
      spread: {within_culture: 12.0, between_culture: 30.0}   # from a pilot: what check's detectable effect uses
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spikeloop.bridge.wire.settings import MAX_PROTOCOL_PHASE_S
from spikeloop.models.closed_loop.settings import DEVICE_ID_CHARACTERS, MAX_SEED

MAX_CULTURES = 1000
"""Cultures of one design: more dishes than any lab runs at once."""
MAX_CONDITIONS = 12
"""Conditions of one design: a culture takes each in turn, so 12 blocks is already a long sequence."""
MAX_REPEATS = 20
"""Passes of one culture through its order."""
MAX_BLOCK_MINUTES = 24 * 60.0

STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class CultureUnit(BaseModel):
    """One culture of the design and the device it sits on."""

    model_config = STRICT
    culture_id: str = Field(
        min_length=1,
        max_length=64,
        pattern=f"^[{DEVICE_ID_CHARACTERS}]+$",
        description="the dish's own name, kept across recording days (the device may change)",
    )
    device: str = Field(min_length=1, description="the device_id (of `devices:`) the culture sits on")
    culture_seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="simulated devices: which simulated dish (absent: the culture's place in the list)",
    )


class Spread(BaseModel):
    """How much a block's metric varies, in the metric's own units: from a pilot or a simulated design."""

    model_config = STRICT
    within_culture: float = Field(gt=0, description="s.d. of one block around its culture's mean for its condition")
    between_culture: float = Field(0.0, ge=0, description="s.d. of the cultures' own means")


class DesignSection(BaseModel):
    """Cultures as units, each taking every condition in blocks (see the module docstring)."""

    model_config = STRICT
    order: Literal["williams", "fixed"] = Field(
        "williams",
        description="williams: an order per culture balanced for first-order carry-over; fixed: the grid's order "
        "for every culture (order and carry-over then confound the conditions: kept to show that)",
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="deals the orders to the cultures; recorded")
    cultures: list[CultureUnit] = Field(min_length=1, max_length=MAX_CULTURES)
    conditions: dict[str, list[Any]] = Field(
        min_length=1, description="a grid over experiment keys: every combination is one condition"
    )
    repeats: int = Field(1, ge=1, le=MAX_REPEATS, description="passes of each culture through its order")
    block_env_steps: int | None = Field(None, ge=1, le=2**31, description="each block's budget in env steps")
    block_minutes: float | None = Field(
        None, gt=0, le=MAX_BLOCK_MINUTES, description="each block's budget in minutes of culture time"
    )
    rest_s: float = Field(
        300.0, ge=0, le=MAX_PROTOCOL_PHASE_S, description="between blocks: no stimulation, activity recorded"
    )
    fresh: Literal["learner"] = Field(
        "learner",
        description="what starts fresh in each block: the learner (a new agent from the experiment's seed); the "
        "culture always carries over. A learner carried across blocks is not offered: it would carry one "
        "condition's training into the next, a carry-over the design could not balance",
    )
    spread: Spread | None = Field(None, description="what `check` uses for the smallest detectable effect")

    @model_validator(mode="after")
    def _shape(self) -> DesignSection:
        if (self.block_env_steps is None) == (self.block_minutes is None):
            raise ValueError(
                "design: give each block's budget as exactly one of block_env_steps or block_minutes "
                "(e.g. block_env_steps: 2048)"
            )
        ids = [c.culture_id for c in self.cultures]
        twice = next((i for i in ids if ids.count(i) > 1), None)
        if twice is not None:
            raise ValueError(f"design.cultures: culture_id {twice!r} is listed twice; each dish is one unit")
        for key, values in self.conditions.items():
            if not values:
                raise ValueError(f"design.conditions.{key}: list at least one value, e.g. [true, false]")
        count = self.condition_count()
        if count > MAX_CONDITIONS:
            raise ValueError(
                f"design.conditions: {count} conditions, more than {MAX_CONDITIONS} blocks per pass of a culture; "
                "compare fewer values"
            )
        if count < 2:
            raise ValueError("design.conditions: a design compares at least 2 conditions; list two values or more")
        return self

    def condition_count(self) -> int:
        return math.prod(len(v) for v in self.conditions.values())

    def blocks_per_culture(self) -> int:
        return self.condition_count() * self.repeats
