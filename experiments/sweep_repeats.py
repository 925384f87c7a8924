"""Grid points that repeat another exactly: a setting swept where another setting makes it do nothing.

`feedback.episode_feedback_surprise_scaling` scales episode feedback only while episode feedback is sent and
surprise scaling is on (`INERT_WHEN` in models/closed_loop/feedback.py), so in a full grid over the reference
trainer's feedback switches 6 of its 16 configurations are the same experiment as another: an unpaced simulated
run writes the same episodes byte for byte, and a device run would spend culture time on a replicate it did
not ask for. `spikeloop tune` runs one configuration of each such set (the first in grid order), writes the
others to the run directory's `repeats.json`, and `spikeloop analyze` reads each repeat as the configuration it
repeats, so the grid stays a full factorial for main effects.

Only all-grid search spaces are thinned: keys drawn at random make every trial different anyway.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from typing import Any

from spikeloop.experiments.dotted import get_path
from spikeloop.experiments.schema import set_path
from spikeloop.experiments.trial_files import REPEATS_FILE
from spikeloop.models.closed_loop.feedback import INERT_WHEN

__all__ = ["REPEATS_FILE", "Repeat", "grid_points", "reasons", "thin_grid"]


@dataclass(frozen=True)
class Repeat:
    """A grid point not run: `same_as` is the point run in its place, `why` the setting that does nothing."""

    configuration: dict[str, Any]
    same_as: dict[str, Any]
    why: str

    def to_json(self) -> dict[str, Any]:
        """As written to repeats.json."""
        return {"configuration": self.configuration, "same_as": self.same_as, "why": self.why}


def reasons(repeats: list[Repeat]) -> str:
    """The distinct reasons of some repeats, in order, as one phrase."""
    return "; ".join(dict.fromkeys(why for r in repeats for why in r.why.split("; ")))


def grid_points(search_space: dict[str, dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Every point of an all-grid search space, the first key varying slowest; None if any key is drawn."""
    if not search_space or any("grid" not in spec for spec in search_space.values()):
        return None
    keys = list(search_space)
    return [
        dict(zip(keys, values, strict=True)) for values in itertools.product(*(search_space[k]["grid"] for k in keys))
    ]


def _inert(experiment: dict[str, Any], key: str) -> str | None:
    """Why `key` does nothing in this experiment (None: it may matter)."""
    for other, value in INERT_WHEN.get(key, ()):
        try:
            if get_path(experiment, other) == value:
                return f"{key} has no effect while {other} is {json.dumps(value)}"
        except KeyError:
            continue  # not written out: the default, which the resolved experiment always writes
    return None


def thin_grid(
    base: dict[str, Any], search_space: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[Repeat]]:
    """(points to run, repeats) of an all-grid search space over the resolved experiment `base`.

    Two points are the same experiment when they differ only in settings that do nothing in both. A search
    space with a drawn key is returned whole (no repeats).
    """
    points = grid_points(search_space)
    if points is None:
        return [], []
    run: list[dict[str, Any]] = []
    repeats: list[Repeat] = []
    seen: dict[str, dict[str, Any]] = {}
    for point in points:
        experiment = copy.deepcopy(base)
        for key, value in point.items():
            set_path(experiment, key, value)
        reasons = {key: why for key in point if (why := _inert(experiment, key)) is not None}
        identity = json.dumps({k: v for k, v in point.items() if k not in reasons}, sort_keys=True, default=str)
        identity += json.dumps(sorted(reasons))
        if identity in seen:
            repeats.append(Repeat(point, seen[identity], "; ".join(reasons.values())))
        else:
            seen[identity] = point
            run.append(point)
    return run, repeats
