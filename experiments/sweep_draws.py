"""The experiments a sweep can draw (`tune.search_space`), each to be checked as the base experiment is.

A trial's experiment is the base one with its drawn values set; a value the base experiment's checks would
refuse (a seed numpy cannot take, a size no machine places) must be refused before Ray starts, naming the
sweep key, not inside a trial. A grid or choice draws each listed value; a range (uniform, loguniform, randint)
its two ends, the values furthest from the base. Up to `MAX_COMBINATIONS` combinations every combination of
the keys' values is checked (two values can be fine alone and not together: a minibatch and a batch); past it,
each key's values one at a time.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from typing import Any

MAX_COMBINATIONS = 256
"""Combinations of swept values checked together (each a few ms); a larger sweep is checked key by key."""


def drawn_values(kind: str, arg: Any) -> list[Any]:
    """The values of one search entry a trial can get, as far as checking goes (a range: its two ends)."""
    if kind in ("grid", "choice"):
        return list(arg)
    return [arg[0], arg[1] - 1] if kind == "randint" else [arg[0], arg[1]]


def drawn_trees(plain: dict[str, Any], search_space: dict[str, dict[str, Any]]) -> Iterator[tuple[Any, dict]]:
    """(what was drawn, as (key, value) pairs; the trial's experiment as plain data) for each checked draw."""
    from spikeloop.experiments.schema import set_path

    per_key = [[(key, v) for v in drawn_values(*next(iter(spec.items())))] for key, spec in search_space.items()]
    if math.prod(len(values) for values in per_key) <= MAX_COMBINATIONS:
        draws: Any = itertools.product(*per_key)
    else:
        draws = ([pair] for values in per_key for pair in values)
    for draw in draws:
        data = copy.deepcopy(plain)
        data["tune"]["search_space"] = {}
        for key, value in draw:
            set_path(data, key, value)
        yield draw, data


def _what(draw: Any) -> tuple[str, str]:
    """(the key a message names: the one swept key, or tune.search_space; the draw as `key=value, ...`)."""
    where = f"tune.search_space.{draw[0][0]}" if len(draw) == 1 else "tune.search_space"
    return where, ", ".join(f"{key}={value!r}" for key, value in draw)


def check_drawn(experiment: Any, source: str) -> None:
    """Every draw of the sweep validated and checked before the run (`check_before_run`), as the base one is;
    ExperimentError names the sweep key and the value."""
    from spikeloop.experiments.fit import trial_request
    from spikeloop.experiments.schema import ExperimentError, check_before_run, experiment_from_dict

    space = experiment.tune.search_space
    if not space:
        return
    base = trial_request(experiment)
    for draw, data in drawn_trees(experiment.plain(), space):
        where, drawn = _what(draw)
        try:
            trial = experiment_from_dict(data, source="drawn")
            check_before_run(trial, "drawn")
        except ExperimentError as exc:
            problem = str(exc).split("\n", 1)[-1].strip()
            raise ExperimentError(
                f"{source}: 1 problem(s):\n  {where}: a trial drawing {drawn} cannot run: {problem}; sweep only "
                "values the experiment takes"
            ) from None
        need = trial_request(trial)
        if need != base:  # Tune places every trial with one request: the base experiment's
            raise ExperimentError(
                f"{source}: 1 problem(s):\n  {where}: a trial drawing {drawn} would ask Ray for {_fmt(need)}, "
                f"but Tune places every trial with the base experiment's {_fmt(base)}, so it would fail inside "
                "Tune; sweep settings that keep a trial's resources, and run one experiment per size"
            )


def _fmt(request: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(request.items()) if v > 0) or "nothing"
