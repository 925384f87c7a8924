"""`spikeloop bench learning --curriculum EXP.yaml`: the learning benchmark through a curriculum of scenarios.

The curriculum (`env.curriculum`, e.g. experiments/deadly_corridor.yaml: the reference trainer's deadly
corridor, levels 1 to 5 on vizdoom's own map) moves each run to the next level by itself. Returns of
different levels do not compare (the levels differ in difficulty), so per condition and seed this reads:

  level reached     the highest level the run played an episode in (1-based)
  at the last level its episodes there, the env steps when it got there, and its final return there
                    (the last 100 episodes played at that level, or all of them when fewer)

and each condition against `random` (noise in place of spikes: the floor a culture must beat, as on
defend_the_center): one-sided exact rank-sum tests (exact with ties) of the levels reached and, where both
sides have seeds that got to the last level, of the final return there.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from spikeloop.experiments.analysis.stats import cliffs_delta, rank_sum_test
from spikeloop.experiments.analysis.sweep import FINAL_EPISODES

FLOOR = "random"
"""The condition every other one is compared with at the last level."""


def load_curriculum_env(path: Path) -> dict[str, Any]:
    """The `env` section of an experiment file that has a curriculum (its first level as `scenario`)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--curriculum {path}: cannot read it ({exc})") from None
    env = (data or {}).get("env") if isinstance(data, dict) else None
    curriculum = (env or {}).get("curriculum")
    if not isinstance(curriculum, dict) or not curriculum.get("scenarios"):
        raise ValueError(
            f"--curriculum {path}: its env section has no curriculum with scenarios (env.curriculum.scenarios); "
            "give an experiment like experiments/deadly_corridor.yaml"
        )
    env = copy.deepcopy(env)
    env["scenario"] = curriculum["scenarios"][0]
    return env


def stage_index(scenario: str | None, stages: Sequence[str]) -> int:
    """The 0-based level of an episode's scenario; ValueError for a scenario not in the curriculum."""
    if scenario not in stages:
        raise ValueError(f"an episode of scenario {scenario!r}, not one of the curriculum's {list(stages)}")
    return list(stages).index(scenario)


def summarize(runs: dict[str, dict[str, list[tuple]]], stages: Sequence[str], alpha: float) -> dict[str, Any]:
    """Levels reached and the last level's figures per condition and seed; each condition against `random`.

    `runs`: condition -> seed -> episodes as (env steps, return, killed, level index) in episode order; `alpha`:
    the level the target is read at (the learning benchmark's).
    """
    last = len(stages) - 1
    conditions: dict[str, Any] = {}
    for condition, by_seed in runs.items():
        reached, at_last, steps_to_last, final = {}, {}, {}, {}
        for seed, episodes in by_seed.items():
            levels = [int(e[3]) for e in episodes]
            reached[seed] = 1 + max(levels, default=0)
            there = [e for e in episodes if int(e[3]) == last]
            at_last[seed] = len(there)
            steps_to_last[seed] = int(there[0][0]) if there else None
            tail = there[-FINAL_EPISODES:]
            final[seed] = sum(float(e[1]) for e in tail) / len(tail) if tail else None
        conditions[condition] = {
            "level_reached": reached,
            "reached_last_level": sum(level == last + 1 for level in reached.values()),
            "episodes_at_last_level": at_last,
            "env_steps_to_last_level": steps_to_last,
            "final_return_at_last_level": final,
        }
    against = {
        c: _against_floor(conditions[c], conditions[FLOOR]) for c in conditions if c != FLOOR and FLOOR in conditions
    }
    return {"levels": list(stages), "alpha": alpha, "conditions": conditions, f"vs_{FLOOR}": against}


def _against_floor(mine: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """One-sided exact rank-sum tests against the floor: levels reached, and the final return at the last level."""
    out: dict[str, Any] = {}
    for key in ("level_reached", "final_return_at_last_level"):
        a = [float(v) for v in mine[key].values() if v is not None]
        b = [float(v) for v in floor[key].values() if v is not None]
        test = rank_sum_test(a, b, "greater")
        out[key] = {
            "seeds": [len(a), len(b)],
            "p": None if math.isnan(test.p) else test.p,  # NaN: a side has no seed to test
            "smallest_p": None if math.isnan(test.smallest_p) else test.smallest_p,
            "cliffs_delta": cliffs_delta(a, b) if a and b else None,
        }
    return out


def target(summary: dict[str, Any], condition: str = "transparent") -> dict[str, Any]:
    """The issue's target: `condition` reaches the last level in every seed and beats `random` there (p < alpha).

    "There": by the final return at the last level where `random` has seeds that got there; where none did,
    by the levels reached (random never got there at all, which the test of levels then has to show).
    """
    description = (
        f"{condition} reaches level {len(summary['levels'])} in every seed and beats {FLOOR} there "
        f"(one-sided exact rank-sum p < {summary['alpha']:g})"
    )
    mine, floor = summary["conditions"].get(condition), summary["conditions"].get(FLOOR)
    if mine is None or floor is None:
        return {"description": description, "met": None, "reason": f"{condition} or {FLOOR} was not run"}
    every_seed = mine["reached_last_level"] == len(mine["level_reached"])
    versus = summary[f"vs_{FLOOR}"][condition]
    by = "final_return_at_last_level" if floor["reached_last_level"] else "level_reached"
    p = versus[by]["p"]
    beats = p is not None and p < summary["alpha"]
    return {
        "description": description,
        "reached_in_every_seed": every_seed,
        "compared_by": by,
        "p": p,
        "met": bool(every_seed and beats),
        "reason": None,
    }
