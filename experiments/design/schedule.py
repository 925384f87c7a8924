"""A design's schedule: which culture takes which condition in which block, on which device, for how long.

The schedule is fixed from the design and its seed before anything runs, so it can be printed by `spikeloop
check`, recorded with the run, and read back by the analysis: what was dealt, and how (the order, the number of
conditions, cultures and passes), which is what the exact test of experiments/analysis/crossover.py permutes over.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from spikeloop.experiments.design.settings import DesignSection
from spikeloop.experiments.design.williams import deal, is_balanced


@dataclass(frozen=True)
class Condition:
    """One grid point of the design's conditions: the experiment keys it sets."""

    index: int
    values: dict[str, Any]

    @property
    def label(self) -> str:
        return ", ".join(f"{key}={json.dumps(value)}" for key, value in self.values.items())


@dataclass(frozen=True)
class Block:
    """One block: a culture playing under one condition for the block's budget."""

    culture_id: str
    device: str
    period: int
    """0-based place in the culture's sequence (all passes counted)."""
    condition: int
    previous: int | None
    """The condition of the culture's block before (None for its first): what a first-order carry-over comes from."""


@dataclass
class Schedule:
    """Every culture's sequence of blocks, with the design's randomisation recorded."""

    order: str
    seed: int
    conditions: list[Condition]
    cultures: list[dict[str, Any]]
    """Per culture: culture_id, device, culture_seed (simulated) and `sequence`: its conditions in order, every
    pass (an order of its own each) one after another."""
    repeats: int
    rows: list[list[int]] = field(default_factory=list)
    """The orders the design dealt from (Williams rows with the labels its seed shuffled): what `balanced` counts."""

    def blocks(self) -> list[Block]:
        out = []
        for culture in self.cultures:
            previous = None
            for period, condition in enumerate(culture["sequence"]):
                out.append(Block(culture["culture_id"], culture["device"], period, condition, previous))
                previous = condition
        return out

    def balanced(self) -> bool:
        """In every pass, every order dealt equally often; the orders balanced for first-order carry-over."""
        if self.order != "williams":
            return False
        k = len(self.conditions)
        passes = [[c["sequence"][p * k : (p + 1) * k] for c in self.cultures] for p in range(self.repeats)]
        per_row = [orders.count(row) for orders in passes for row in self.rows]
        return len(set(per_row)) == 1 and is_balanced(self.rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "seed": self.seed,
            "repeats": self.repeats,
            "conditions": [c.values for c in self.conditions],
            "cultures": self.cultures,
            "rows": self.rows,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        conditions = [Condition(i, dict(values)) for i, values in enumerate(data["conditions"])]
        return cls(data["order"], data["seed"], conditions, data["cultures"], data["repeats"], data["rows"])


def conditions_of(design: DesignSection) -> list[Condition]:
    """The grid's points in the order the file lists keys and values (the fixed order's order)."""
    keys = list(design.conditions)
    points = itertools.product(*(design.conditions[k] for k in keys))
    return [Condition(i, dict(zip(keys, point, strict=True))) for i, point in enumerate(points)]


def schedule(design: DesignSection, simulated: Set[str] = frozenset()) -> Schedule:
    """The design's schedule, from its seed; cultures on `simulated` devices get a culture seed."""
    conditions = conditions_of(design)
    k = len(conditions)
    if design.order == "fixed":
        rows = [list(range(k))]
        sequences = [list(range(k)) * design.repeats for _ in design.cultures]
    else:
        rows, sequences = deal(k, len(design.cultures), design.seed, design.repeats)
    cultures = [
        {
            "culture_id": c.culture_id,
            "device": c.device,
            "culture_seed": (c.culture_seed if c.culture_seed is not None else i) if c.device in simulated else None,
            "sequence": sequences[i],
        }
        for i, c in enumerate(design.cultures)
    ]
    return Schedule(design.order, design.seed, conditions, cultures, design.repeats, rows)


@dataclass(frozen=True)
class Timing:
    """How long the design keeps its cultures and devices busy (culture time: wall time on a real device)."""

    block_s: float
    per_culture_s: float
    per_device_s: dict[str, float]

    @property
    def device_hours(self) -> float:
        return sum(self.per_device_s.values()) / 3600.0

    @property
    def wall_s(self) -> float:
        """Devices work in parallel; the cultures on one device take turns."""
        return max(self.per_device_s.values())


def timing(design: DesignSection, exchange_s: float, rounds: int, simulated: Set[str] = frozenset()) -> Timing:
    """Block and rest lengths in culture time; `exchange_s` per exchange, `rounds` exchanges per env step.

    Cultures on one real device take turns; a simulated device is a template that starts one culture per
    use (`simulated`: those device ids), so its cultures count as devices of their own.
    """
    if design.block_minutes is not None:
        block_s = design.block_minutes * 60.0
    else:
        assert design.block_env_steps is not None
        block_s = design.block_env_steps * exchange_s * rounds
    blocks = design.blocks_per_culture()
    per_culture = blocks * block_s + (blocks - 1) * design.rest_s
    per_device: dict[str, float] = {}
    for culture in design.cultures:
        where = f"{culture.device}:{culture.culture_id}" if culture.device in simulated else culture.device
        per_device[where] = per_device.get(where, 0.0) + per_culture
    return Timing(block_s, per_culture, per_device)


def balance_line(plan: Schedule) -> str:
    if plan.order == "fixed":
        return (
            "order: fixed, every culture the same order: period, drift and carry-over are confounded with the "
            "conditions, and no randomisation test is possible"
        )
    needed = len(plan.rows)
    n = len(plan.cultures)
    if plan.balanced():
        return f"order: Williams, balanced for first-order carry-over ({n} cultures = {n // needed} x {needed} orders)"
    return (
        f"order: Williams, NOT balanced: {n} culture(s) is not a multiple of the {needed} orders a balanced set of "
        f"{len(plan.conditions)} conditions needs; use {needed * max(1, -(-n // needed))} cultures"
    )
