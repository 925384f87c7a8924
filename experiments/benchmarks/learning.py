"""`spikeloop bench learning`: learning curves over seeds, with statistics that can say yes or no.

Five conditions, each trained for the same env-step budget with several seeds:

  direct       features straight to actions, no culture (the no-neurons control)
  transparent  the perfect-channel device: the culture path with a lossless culture
  sim          the simulated culture
  zero         the decoder input set to zeros (chance)
  random       the decoder input set to Poisson noise
                 (both read no culture, so they run against the `zero` backend: conditions.ABLATION_CONDITIONS)

and, on request (`--conditions`), not by default:

  sim_reference  the simulated culture stimulated as the reference device does (`stim_mode: reference`:
                 every stimulable electrode interrupted, then one pulse per encoding electrode); `sim` is
                 spikeloop's default (`stim_mode: burst`, a burst lasting one tick)

Runs are interleaved (for each seed, every condition), so that drift in machine
load hits every condition alike; `--jobs N` trains N of them at once, each in a
process of its own (`parallel`). The result file is rewritten after every
finished run, and `--resume` skips the runs it already holds.

Per condition the summary gives the final return and kill rate (last 100
episodes, per seed and pooled), the env steps to reach 90% of the way from
chance to `direct`'s final return, and one-sided exact Mann-Whitney tests
against `zero` (decides at alpha 0.01) and, where it ran, against `random`
(`vs_random`: the floor on a map where an action preference alone pays).
`targets` reads the issue's targets from the data, each with `met` true, false
or null (not run, or not readable): on `basic` three (a, b, c), on another
scenario one (`d_beat_random`: transparent and sim each beat random at
p < 0.01, within 100,000 env steps). Target a's return threshold is in the
default reward's units: where `--env` changes the reward, only its kill rate
is read.

The feedback controls (`FEEDBACK_CONDITIONS`, run by `spikeloop bench feedback`)
are further conditions of the same benchmark: the simulated culture with one
plasticity rule (`stdp`, `dopamine_stdp`, `none`), feedback on or off, and on
with the device's `feedback_settle_ms` (no feedback-evoked spike in a
collection window). `feedback_effects` compares each "on" with its "off" (and
the direct path with and without the settle time): the difference of final
returns, paired by seed, with its 95% interval, and the exact tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spikeloop.experiments.benchmarks import curriculum, drift, parallel
from spikeloop.experiments.benchmarks.conditions import (  # noqa: F401  (re-exported: the benchmark's conditions)
    ALL_CONDITIONS,
    BASE_EXPERIMENT,
    CONDITIONS,
    CONTROL_CULTURES,
    EXTRA_CONDITIONS,
    FEEDBACK_CONDITIONS,
    FEEDBACK_ON,
    FEEDBACK_SETTLE_MS,
    FRESH_FIRST_SEED,
    SCENARIO,
    TUNING_SEEDS,
    control_culture,
    deep_merge,
    experiment_dict,
)
from spikeloop.experiments.benchmarks.curriculum import FLOOR
from spikeloop.experiments.benchmarks.one_run import WINDOW, Episode, train_run
from spikeloop.experiments.benchmarks.record import provenance, write_result
from spikeloop.experiments.dotted import flatten
from spikeloop.experiments.ray_session import private_ray
from spikeloop.experiments.strict_json import json_safe

DEFAULT_OUTPUT = Path("docs/benchmarks/learning.json")
ALPHA = 0.01
"""Significance level of the tests against `zero`."""
TARGET_KILL_RATE = 0.95
TARGET_RETURN = -425.0
TARGET_STEPS_RATIO = 1.5
HARDER_CONDITIONS = ("transparent", "sim")
"""The conditions that must beat `FLOOR` off `basic`."""
HARDER_MAX_ENV_STEPS = 100_000
"""The largest budget the target off `basic` may use."""
MIN_ENV_STEPS = 1000
DEFAULT_ENV_STEPS = 20_000
"""Where direct and transparent are at their best: longer runs drift down (measured:
docs/benchmarks.md, learning, "Longer runs drift"; run times there too)."""

FEEDBACK_COMPARISONS: tuple[tuple[str, str], ...] = (
    ("dopamine_on_settle", "dopamine_off"),
    ("dopamine_on", "dopamine_off"),
    ("stdp_on", "stdp_off"),
    ("none_on", "none_off"),
    ("none_on_settle", "none_off"),
    ("none_on", "none_on_settle"),
    ("dopamine_on_settle", "dopamine_frozen_on_settle"),
    ("dopamine_frozen_on_settle", "dopamine_off"),
)
"""(a, b) pairs read in `feedback_effects`: feedback's effect per rule, the direct path with and without settle, and
on the positive control's culture the plastic path (weights free against frozen) and the pulses alone."""


Runs = dict[str, dict[str, list[Episode]]]
"""condition -> seed (str) -> episodes in order."""


# --- statistics (pure: no Ray) ---------------------------------------------------


def _rolling(values: Sequence[float], window: int = WINDOW) -> tuple[list[float], int]:
    """Trailing means over `window` values (all values when fewer), from the first full window on; and that window."""
    n = len(values)
    w = min(window, n)
    if not w:
        return [], 0
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= w:
            total -= values[i - w]
        if i >= w - 1:
            out.append(total / w)
    return out, w


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _per_seed(by_seed: dict[str, list[Episode]], fn) -> dict[str, Any]:
    per_seed = {seed: _finite(fn(eps)) if eps else None for seed, eps in by_seed.items()}
    return {"per_seed": per_seed, "pooled": _mean([v for v in per_seed.values() if v is not None])}


def _final_return(eps: list[Episode]) -> float:
    tail = eps[-WINDOW:]
    return sum(e[1] for e in tail) / len(tail)


def _final_kill_rate(eps: list[Episode]) -> float:
    tail = eps[-WINDOW:]
    return sum(e[2] for e in tail) / len(tail)


def steps_to_mark(eps: list[Episode], mark: float) -> tuple[float | None, bool]:
    """Env steps at which the rolling-100 mean return first reaches `mark` (None: never); and whether the window was short."""
    rolling, w = _rolling([e[1] for e in eps])
    for i, value in enumerate(rolling):
        if value >= mark:
            return eps[i + w - 1][0], w < WINDOW
    return None, bool(eps) and w < WINDOW


def _median_or_never(values: list[float | None]) -> float | None:
    """Median over seeds with "never" as infinitely late; None if that median is "never" (or no seeds)."""
    if not values:
        return None
    median = statistics.median([math.inf if v is None else v for v in values])
    return float(median) if math.isfinite(median) else None


def chance(runs: Runs) -> tuple[float | None, str]:
    """The return of the untrained policy and where it came from."""
    if runs.get("zero"):
        value = _mean([sum(e[1] for e in eps) / len(eps) for eps in runs["zero"].values() if eps])
        if value is not None:
            return value, (
                f"zero condition: mean over {len(runs['zero'])} seed(s) of every episode's return "
                "(a zero-input, bias-free decoder acts uniformly and never learns)"
            )
    firsts = [
        sum(e[1] for e in eps[:WINDOW]) / len(eps[:WINDOW])
        for by_seed in runs.values()
        for eps in by_seed.values()
        if eps
    ]
    return _mean(firsts), f"no zero condition: mean over {len(firsts)} run(s) of each run's first {WINDOW} episodes"


def summarize(
    runs: Runs,
    scenario: str = SCENARIO,
    budget: int | None = None,
    is_curriculum: bool = False,
    reward_changed: Sequence[str] = (),
) -> dict[str, Any]:
    """Per-condition statistics, chance, the 90% mark, the tests against zero and random, verdicts and targets.

    `runs` maps condition -> seed (str) -> [(env steps, return, killed)] in episode order. `basic` has its
    targets (`_targets`); another scenario has one, `_harder_target` (the channel and the culture beat `random`
    within `HARDER_MAX_ENV_STEPS`; `budget` is the runs' env-step budget). A curriculum run (`is_curriculum`) has
    its own target, read per level by `build_result`. `reward_changed` lists the env settings that make the
    reward other than the default (`reward_changes`): a return threshold stated in the default's units is then
    not read.
    """
    from spikeloop.experiments.analysis import compare, min_seeds_per_group, verdict

    order = [*ALL_CONDITIONS, *sorted(set(runs) - set(ALL_CONDITIONS))]
    runs = {c: runs[c] for c in order if c in runs and runs[c]}
    notes: list[str] = []
    summary: dict[str, dict[str, Any]] = {}
    for condition, by_seed in runs.items():
        summary[condition] = {
            "seeds": len(by_seed),
            "episodes": {seed: len(eps) for seed, eps in by_seed.items()},
            "final_return_mean": _per_seed(by_seed, _final_return),
            "final_kill_rate": _per_seed(by_seed, _final_kill_rate),
        }
    chance_return, chance_from = chance(runs)
    seeds_run = sorted({int(seed) for by_seed in runs.values() for seed in by_seed})
    if seeds_run and all(seed in TUNING_SEEDS for seed in seeds_run):
        notes.append(
            f"seeds {', '.join(map(str, seeds_run))} are tuning seeds (every setting was chosen reading them): "
            f"these runs describe those choices and do not test them afresh; fresh seeds: --first-seed "
            f"{FRESH_FIRST_SEED}"
        )

    # The 90% mark: 90% of the way from chance to direct's final return.
    direct_final = summary.get("direct", {}).get("final_return_mean", {}).get("pooled")
    mark = None
    if "direct" not in runs:
        notes.append("direct was not run: no 90% mark, steps_to_90pct_direct is null")
    elif chance_return is None or direct_final is None:
        notes.append("no finished episodes to set the 90% mark from")
    elif direct_final <= chance_return + 1e-9 * max(1.0, abs(chance_return)):  # rounding is not learning
        notes.append(
            f"direct's final return {direct_final:.1f} is not above chance {chance_return:.1f}: "
            "no 90% mark, steps_to_90pct_direct is null"
        )
    else:
        mark = chance_return + 0.9 * (direct_final - chance_return)
    for condition, by_seed in runs.items():
        per_seed, short = {}, []
        for seed, eps in by_seed.items():
            per_seed[seed], was_short = steps_to_mark(eps, mark) if mark is not None else (None, False)
            if was_short:
                short.append(seed)
        summary[condition]["steps_to_90pct_direct"] = {
            "per_seed": per_seed,
            "median": _median_or_never(list(per_seed.values())) if mark is not None else None,
            "reached": sum(v is not None for v in per_seed.values()),
            "short_window_seeds": short,  # runs with fewer than WINDOW episodes: the rolling mean is over all of them
        }
        if short:
            notes.append(
                f"{condition}: seed(s) {', '.join(short)} finished fewer than {WINDOW} episodes; "
                "their windows hold all of their episodes"
            )

    # One-sided exact Mann-Whitney against zero, on per-seed finals.
    comparisons: dict[str, Any] = {}
    verdicts: dict[str, str] = {}
    zero = summary.get("zero")
    if zero is None:
        notes.append("zero was not run: no tests against zero")
    for condition, s in summary.items():
        s.update(
            {
                "p_value_vs_zero": None,
                "cliffs_delta_vs_zero": None,
                "welch_p_vs_zero": None,
                "kill_p_value_vs_zero": None,
                "kill_cliffs_delta_vs_zero": None,
            }
        )
        if zero is None or condition == "zero":
            continue
        c, k = (
            compare(condition, _finals(s, key), "zero", _finals(zero, key), alternative="greater")
            for key in ("final_return_mean", "final_kill_rate")
        )
        s.update(
            {
                "p_value_vs_zero": _finite(c.mann_whitney_p),
                "cliffs_delta_vs_zero": _finite(c.cliffs_delta),
                "welch_p_vs_zero": _finite(c.welch_p),
                "kill_p_value_vs_zero": _finite(k.mann_whitney_p),
                "kill_cliffs_delta_vs_zero": _finite(k.cliffs_delta),
            }
        )
        comparisons[condition] = c
        verdicts[condition] = verdict(c, alpha=ALPHA)

    # One-sided exact Mann-Whitney against random: on a map where an action preference alone pays, noise in place
    # of spikes is the floor a channel must beat (docs/benchmarks.md, "learning on a harder scenario").
    floor = summary.get(FLOOR)
    for condition, s in summary.items():
        if floor is None or condition == FLOOR:
            continue
        r, k = (
            compare(condition, _finals(s, key), FLOOR, _finals(floor, key), alternative="greater")
            for key in ("final_return_mean", "final_kill_rate")
        )
        s["vs_random"] = {
            "p_value": _finite(r.mann_whitney_p),
            "cliffs_delta": _finite(r.cliffs_delta),
            "kill_p_value": _finite(k.mann_whitney_p),
            "kill_cliffs_delta": _finite(k.cliffs_delta),
            "test": "one-sided exact Mann-Whitney on per-seed finals (last 100 episodes): greater than random",
        }

    # The reference device's stimulation against spikeloop's, both ways (two-sided): does the choice matter?
    if "sim" in summary and "sim_reference" in summary:
        r, k = (
            compare(
                "sim_reference",
                _finals(summary["sim_reference"], key),
                "sim",
                _finals(summary["sim"], key),
                alternative="two-sided",
            )
            for key in ("final_return_mean", "final_kill_rate")
        )
        summary["sim_reference"]["vs_sim"] = {
            "difference_return": _finite(r.difference),
            "p_value": _finite(r.mann_whitney_p),
            "cliffs_delta": _finite(r.cliffs_delta),
            "difference_kill_rate": _finite(k.difference),
            "kill_p_value": _finite(k.mann_whitney_p),
            "kill_cliffs_delta": _finite(k.cliffs_delta),
            "test": "two-sided exact Mann-Whitney on per-seed finals (last 100 episodes)",
        }

    targets: dict[str, Any] = {}
    longer: dict[str, Any] = {}
    if set(summary) & set(CONDITIONS) and not is_curriculum:
        min_seeds = min_seeds_per_group(ALPHA, "greater")
        if scenario == SCENARIO:
            targets = _targets(summary, min_seeds, reward_changed)
            if budget is not None and budget > DEFAULT_ENV_STEPS:  # a longer run: does it end worse than it was?
                longer["drift"] = drift.read(runs, DEFAULT_ENV_STEPS, _final_return, _final_kill_rate)
                targets["e_no_drift"] = drift.target(longer["drift"], budget, DEFAULT_ENV_STEPS, min_seeds)
                notes.append(
                    f"a {budget:,}-step run: targets a-c are read at its end; `drift` compares each run's final at "
                    f"the default budget ({DEFAULT_ENV_STEPS:,}) with its final at the end (e_no_drift)"
                )
        else:
            targets = {"d_beat_random": _harder_target(summary, min_seeds, budget)}
            notes.append(f"the {SCENARIO} targets are not read on {scenario}; d_beat_random is this scenario's target")
    return {
        "summary": summary,
        "chance_return": chance_return,
        "chance_from": chance_from,
        "mark_90pct_return": mark,
        "min_seeds_per_group": min_seeds_per_group(ALPHA, "greater"),
        "alpha": ALPHA,
        "verdicts": verdicts,
        "targets": targets,
        "feedback_effects": feedback_effects(summary),
        "notes": notes,
    } | longer


def feedback_effects(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each pair of `FEEDBACK_COMPARISONS` that ran: a - b in final return and kill rate, paired by seed.

    Per pair: the per-seed differences (seeds both ran), their mean with a 95% t interval, the exact one-sided
    Mann-Whitney p that a scores higher than b (unpaired, the test the positive control must pass at alpha 0.01)
    and its two-sided p, the exact Wilcoxon signed-rank p on the paired differences (one- and two-sided; ties and
    zero differences counted exactly), and Cliff's delta.
    """
    from spikeloop.experiments.analysis import compare
    from spikeloop.experiments.analysis.stats import mean_t_interval, signed_rank_test

    out: dict[str, Any] = {}
    for a, b in FEEDBACK_COMPARISONS:
        if a not in summary or b not in summary:
            continue
        entry: dict[str, Any] = {}
        for metric, key in (("final_return", "final_return_mean"), ("kill_rate", "final_kill_rate")):
            va, vb = summary[a][key]["per_seed"], summary[b][key]["per_seed"]
            seeds = sorted(set(va) & set(vb), key=int)
            diffs = [va[s] - vb[s] for s in seeds if va[s] is not None and vb[s] is not None]
            ra = [v for v in va.values() if v is not None]
            rb = [v for v in vb.values() if v is not None]
            mean = _mean(diffs)
            low, high = mean_t_interval(diffs) or (None, None)
            wilcoxon = {"greater": None, "two-sided": None}
            if diffs and any(diffs):  # exact with ties and zero differences, as compare's Mann-Whitney
                for alternative in wilcoxon:
                    wilcoxon[alternative] = _finite(signed_rank_test(diffs, alternative).p)
            entry[metric] = {
                "per_seed_difference": dict(zip(seeds, diffs, strict=False)),
                "mean_difference": _finite(mean),
                "ci95_paired": [_finite(low), _finite(high)] if low is not None else None,
                "mann_whitney_p_greater": _finite(compare(a, ra, b, rb, "greater").mann_whitney_p),
                "mann_whitney_p_two_sided": _finite(compare(a, ra, b, rb, "two-sided").mann_whitney_p),
                "wilcoxon_p_greater": wilcoxon["greater"],
                "wilcoxon_p_two_sided": wilcoxon["two-sided"],
                "cliffs_delta": _finite(compare(a, ra, b, rb).cliffs_delta),
            }
        out[f"{a} - {b}"] = entry
    return out


def _finals(condition_summary: dict[str, Any], key: str) -> list[float]:
    """A condition's per-seed final values of `key` ("final_return_mean" or "final_kill_rate"), runs with none left out."""
    return [v for v in condition_summary[key]["per_seed"].values() if v is not None]


def _harder_target(summary: dict[str, dict[str, Any]], min_seeds: int, budget: int | None) -> dict[str, Any]:
    """Off `basic`: transparent and sim each beat random (one-sided exact Mann-Whitney p < ALPHA), within the budget."""
    from spikeloop.experiments.analysis.stats import holm

    target: dict[str, Any] = {
        "description": f"transparent and sim each beat {FLOOR}: one-sided exact Mann-Whitney p < {ALPHA} on per-seed "
        f"final returns, >= {min_seeds} seeds per condition, within {HARDER_MAX_ENV_STEPS:,} env steps; direct is "
        "the ceiling",
        "env_steps_per_run": budget,
        "conditions": {},
        "holm": None,
        "met": None,
        "reason": None,
    }
    missing = [c for c in (*HARDER_CONDITIONS, FLOOR) if c not in summary]
    for condition in HARDER_CONDITIONS:
        if condition in summary and FLOOR in summary:
            seeds = min(summary[condition]["seeds"], summary[FLOOR]["seeds"])
            p = summary[condition]["vs_random"]["p_value"]
            target["conditions"][condition] = {
                "p_value": p,
                "cliffs_delta": summary[condition]["vs_random"]["cliffs_delta"],
                "enough_seeds": seeds >= min_seeds,
                "met": bool(seeds >= min_seeds and p is not None and p < ALPHA),
            }
    ps = [c["p_value"] for c in target["conditions"].values()]
    if ps and None not in ps:
        target["holm"] = dict(zip(target["conditions"], holm(ps), strict=True))
    if missing:
        target["reason"] = f"{' and '.join(missing)} not run"
    elif budget is None:
        target["reason"] = "the runs' env-step budget is not recorded: the target cannot be read"
    elif budget > HARDER_MAX_ENV_STEPS:
        target["met"] = False
        target["reason"] = f"the budget, {budget:,} env steps, is over {HARDER_MAX_ENV_STEPS:,}"
    else:
        target["met"] = all(c["met"] for c in target["conditions"].values())
        if not all(c["enough_seeds"] for c in target["conditions"].values()):
            target["reason"] = f"fewer than {min_seeds} seeds per condition: no outcome could be significant"
    return target


def reward_changes(env_overrides: dict[str, Any] | None) -> list[str]:
    """The env settings (`--env`) that make the reward other than the default, as `key=value`; none: the default."""
    import inspect

    from spikeloop.envs.doom_env import DoomEnv
    from spikeloop.envs.rewards import RewardSettings

    env = env_overrides or {}
    defaults = dataclasses.asdict(RewardSettings())
    changed = [
        f"reward_settings.{key}={value:g}"
        for key, value in sorted((env.get("reward_settings") or {}).items())
        if value != defaults.get(key)
    ]
    mode = env.get("reward_mode")
    if mode is not None and mode != inspect.signature(DoomEnv).parameters["reward_mode"].default:
        changed.append(f"reward_mode={mode}")
    return changed


def _targets(summary: dict[str, dict[str, Any]], min_seeds: int, reward_changed: Sequence[str] = ()) -> dict[str, Any]:
    """The issue's targets, read from the summary: measured values and `met` (None: cannot be read).

    Target a's return threshold is in the default reward's units: with `reward_changed`, only its kill rate is
    read (a seed below it fails the target; otherwise `met` is None).
    """
    targets: dict[str, Any] = {}

    # (a) direct and transparent solve the scenario in every seed.
    a: dict[str, Any] = {
        "description": f"direct and transparent: kill rate >= {TARGET_KILL_RATE} and final return "
        f">= {TARGET_RETURN} (last {WINDOW} episodes) in every seed",
        "conditions": {},
        "met": None,
        "reason": None,
    }
    missing = [c for c in ("direct", "transparent") if c not in summary]
    for condition in ("direct", "transparent"):
        if condition not in summary:
            continue
        returns = summary[condition]["final_return_mean"]["per_seed"]
        kills = summary[condition]["final_kill_rate"]["per_seed"]
        per_seed = {
            seed: {
                "final_return": returns[seed],
                "kill_rate": kills[seed],
                "met": _solved(returns[seed], kills[seed], return_readable=not reward_changed),
            }
            for seed in returns
        }
        a["conditions"][condition] = {"per_seed": per_seed, "met": _all_met(v["met"] for v in per_seed.values())}
    if missing:
        a["reason"] = f"{' and '.join(missing)} not run"
    else:
        a["met"] = _all_met(v["met"] for v in a["conditions"].values())
        if reward_changed:
            a["reason"] = (
                f"the reward is not the default ({', '.join(reward_changed)}): the return threshold "
                f"{TARGET_RETURN:g} is in the default reward's units, so only the kill rate is read"
            )
    targets["a_direct_transparent_solve"] = a

    # (b) transparent reaches the 90% mark within 1.5x direct's env steps (medians over seeds).
    b: dict[str, Any] = {
        "description": f"transparent reaches the 90% mark (median over seeds) within "
        f"{TARGET_STEPS_RATIO}x the env steps direct needs (median)",
        "direct_median_steps": None,
        "transparent_median_steps": None,
        "ratio": None,
        "met": None,
        "reason": None,
    }
    missing = [c for c in ("direct", "transparent") if c not in summary]
    if missing:
        b["reason"] = f"{' and '.join(missing)} not run"
    else:
        d = summary["direct"]["steps_to_90pct_direct"]["median"]
        t = summary["transparent"]["steps_to_90pct_direct"]["median"]
        b["direct_median_steps"], b["transparent_median_steps"] = d, t
        if d is None:
            b["reason"] = "direct does not reach the 90% mark (median over seeds), or there is no mark"
        elif t is None:
            b["met"], b["reason"] = False, "transparent does not reach the 90% mark (median over seeds)"
        else:
            b["ratio"] = t / d if d > 0 else math.inf if t > 0 else 1.0
            b["met"] = t <= TARGET_STEPS_RATIO * d
            b["ratio"] = _finite(b["ratio"])
    targets["b_transparent_speed"] = b

    # (c) sim beats zero: one-sided exact Mann-Whitney p < alpha with enough seeds.
    c: dict[str, Any] = {
        "description": f"sim beats zero: one-sided Mann-Whitney p < {ALPHA} on per-seed final "
        f"returns with >= {min_seeds} seeds per condition",
        "p_value": None,
        "seeds_sim": None,
        "seeds_zero": None,
        "min_seeds": min_seeds,
        "met": None,
        "reason": None,
    }
    missing = [x for x in ("sim", "zero") if x not in summary]
    if missing:
        c["reason"] = f"{' and '.join(missing)} not run"
    else:
        c["seeds_sim"], c["seeds_zero"] = summary["sim"]["seeds"], summary["zero"]["seeds"]
        c["p_value"] = summary["sim"]["p_value_vs_zero"]
        enough = min(c["seeds_sim"], c["seeds_zero"]) >= min_seeds
        c["met"] = bool(enough and c["p_value"] is not None and c["p_value"] < ALPHA)
        if not enough:
            c["reason"] = f"fewer than {min_seeds} seeds per condition: no outcome could be significant"
    targets["c_sim_beats_zero"] = c
    return targets


def _solved(final_return: float | None, kill_rate: float | None, return_readable: bool) -> bool | None:
    """One seed against target a: False on a kill rate below it, None where the return cannot be read."""
    if kill_rate is None or kill_rate < TARGET_KILL_RATE:
        return False
    if not return_readable:
        return None
    return final_return is not None and final_return >= TARGET_RETURN


def _all_met(verdicts: Any) -> bool | None:
    """True when every verdict is True, False when any is False, None otherwise (some not read)."""
    verdicts = list(verdicts)
    return False if False in verdicts else None if None in verdicts else True


# --- curves as JSON ----------------------------------------------------------------


def curves_from_episodes(episodes: list[Episode]) -> dict[str, list]:
    """One run's episodes as compact parallel arrays (`level` too for a curriculum's runs)."""
    curves = {
        "env_steps": [int(e[0]) for e in episodes],
        "return": [round(float(e[1]), 4) for e in episodes],
        "kill": [int(bool(e[2])) for e in episodes],
    }
    if episodes and len(episodes[0]) > 3:
        curves["level"] = [int(e[3]) for e in episodes]
    return curves


def episodes_from_curves(curves: dict[str, list]) -> list[Episode]:
    """The inverse of `curves_from_episodes`."""
    columns = [curves["env_steps"], curves["return"], curves["kill"]]
    if "level" in curves:
        columns.append(curves["level"])
    return [
        (float(row[0]), float(row[1]), bool(row[2]), *(int(v) for v in row[3:])) for row in zip(*columns, strict=True)
    ]


def runs_from_result(result: dict[str, Any]) -> Runs:
    """The episodes of every run in a result JSON."""
    return {
        condition: {seed: episodes_from_curves(curves) for seed, curves in by_seed.items()}
        for condition, by_seed in result.get("runs", {}).items()
    }


CURVE_KEYS = ("env_steps", "return", "kill", "level")
"""A run's per-episode arrays in a result JSON (`curves_from_episodes`); its other keys are run facts."""


def run_facts_from_result(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The facts of every run in a result JSON (iterations, wall time, ...): `build_result`'s `run_facts`."""
    return {
        condition: {seed: {k: v for k, v in curves.items() if k not in CURVE_KEYS} for seed, curves in by_seed.items()}
        for condition, by_seed in result.get("runs", {}).items()
    }


def _tuning_mix(runs: Runs, wanted: Sequence[str]) -> str | None:
    """Why runs on the tuning seeds and on fresh seeds may not share one result, or None if they do not mix."""
    seeds = {int(s) for by_seed in runs.values() for s in by_seed} | {int(s) for s in wanted}
    tuning = sorted(s for s in seeds if s in TUNING_SEEDS)
    fresh = sorted(s for s in seeds if s not in TUNING_SEEDS)
    if not tuning or not fresh:
        return None
    return (
        f"this would pool runs on the tuning seeds ({', '.join(map(str, tuning))}: every setting was chosen reading "
        f"them) with runs on fresh seeds ({', '.join(map(str, fresh))}), and a result on both is neither a fresh "
        f"test nor the committed one; resume or merge files of one kind (--first-seed 0 for the tuning seeds' files, "
        f"the default {FRESH_FIRST_SEED} for fresh ones), or write to another --output"
    )


def check_resume(existing: dict[str, Any], settings: dict[str, Any]) -> Runs:
    """The runs an earlier result file holds, if it was measured with the same settings; ValueError if not."""
    old = existing.get("settings")
    if not isinstance(old, dict) or "runs" not in existing:
        raise ValueError("--resume: the existing output is not a `bench learning` result (no settings or runs)")
    differences = [
        (what, old.get(key), settings.get(key))
        for key, what in (
            ("scenario", "scenario"),
            ("curriculum_env", "curriculum (env section)"),
            ("env_steps_per_run", "env-step budget"),
            ("base_experiment", "base experiment (spikeloop.experiments.schema learning settings)"),
            ("ppo", "learner settings (--ppo)"),
            ("model", "model settings (--model)"),
            ("env", "env settings (--env)"),
        )
        if old.get(key) != settings.get(key)
    ]
    # Files from before the thread count was recorded hold no figure for it: nothing to compare.
    if "learner_torch_threads" in old and old["learner_torch_threads"] != settings.get("learner_torch_threads"):
        differences.append(
            ("learner thread count (torch)", old["learner_torch_threads"], settings.get("learner_torch_threads"))
        )
    # Feedback controls: what they were run with, for the conditions both hold (a tuned dopamine culture must not
    # be pooled with runs of the old one).
    for key, what in (("feedback_on", "feedback of the feedback controls"), ("feedback_settle_ms", "settle time")):
        if key in old and key in settings and old[key] != settings[key]:
            differences.append((what, old[key], settings[key]))
    old_cultures, new_cultures = old.get("culture", {}), settings.get("culture", {})
    for condition in sorted(set(old_cultures) & set(new_cultures)):
        if old_cultures[condition] != new_cultures[condition]:
            changed = {
                k: (old_cultures[condition].get(k), v)
                for k, v in new_cultures[condition].items()
                if old_cultures[condition].get(k) != v
            }
            differences.append((f"culture for {condition} (old, now)", changed, None))
    for what, was, now in differences:
        raise ValueError(
            f"--resume: the existing output was measured with a different {what}: "
            f"{was!r}, now {now!r}; use another --output or drop --resume"
        )
    return runs_from_result(existing)


def source_provenance(path: Path, existing: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a resumed or merged file's runs were measured: its command, commit and time, and its own sources'."""
    own = {"file": str(path)} | {k: existing.get(k) for k in ("command", "git", "machine", "measured_at")}
    return [own, *existing.get("sources", [])]


SIM_CONDITIONS = ("sim", "zero", "random", *FEEDBACK_CONDITIONS)
"""The conditions that run the simulated culture (`--culture` applies to these)."""


def _culture(condition: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The culture knobs a condition runs with (the dopamine knobs only where the rule uses them)."""
    from spikeloop.bridge.device.simulated_culture import DOPAMINE_KNOBS, SimulatedCultureConfig

    rule = FEEDBACK_CONDITIONS[condition][0] if condition in FEEDBACK_CONDITIONS else "stdp"
    control = control_culture(condition) if condition in FEEDBACK_CONDITIONS else {}
    knobs = dataclasses.asdict(SimulatedCultureConfig.from_mapping(control | (overrides or {}) | {"plasticity": rule}))
    used = {k: v for k, v in knobs.items() if rule == "dopamine_stdp" or k not in DOPAMINE_KNOBS}
    return json.loads(json.dumps(used))  # tuples as lists, as read back


def learner_torch_threads() -> int:
    """Torch's threads in this process, where each run's learner updates: they decide how its sums round.

    A run's episodes part from the first update (and the first weights) on another thread count: `spikeloop train`
    trials get Ray's one thread unless OMP_NUM_THREADS says otherwise (README, "Repeatable runs").
    """
    import torch

    return torch.get_num_threads()


def _settings(
    scenario: str,
    conditions: Sequence[str],
    seeds: int,
    budget: int,
    culture: dict[str, Any] | None = None,
    first_seed: int = 0,
    env: dict[str, Any] | None = None,
    ppo: dict[str, Any] | None = None,
    env_overrides: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    recorded = [c for c in conditions if c in FEEDBACK_CONDITIONS or (culture and c in SIM_CONDITIONS)]
    return (
        {
            "scenario": scenario,
            "conditions": list(conditions),
            "seeds": seeds,
            "first_seed": first_seed,
            "tuning_seeds": list(TUNING_SEEDS),
            "env_steps_per_run": budget,
            "base_experiment": BASE_EXPERIMENT,
            "window_episodes": WINDOW,
            "learner_torch_threads": learner_torch_threads(),
        }
        | (
            {
                "feedback_conditions": {c: FEEDBACK_CONDITIONS[c] for c in conditions if c in FEEDBACK_CONDITIONS},
                "feedback_on": FEEDBACK_ON,
                "feedback_settle_ms": FEEDBACK_SETTLE_MS,
            }
            if set(conditions) & set(FEEDBACK_CONDITIONS)
            else {}
        )
        | ({"culture": {c: _culture(c, culture) for c in recorded}} if recorded else {})
        | ({"curriculum_env": env} if env else {})
        | ({"ppo": ppo} if ppo else {})
        | ({"env": env_overrides} if env_overrides else {})
        | ({"model": model} if model else {})
    )


def build_result(
    settings: dict[str, Any], runs: Runs, run_facts: dict[str, dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """The whole result JSON (without provenance) from the runs so far."""
    stats = summarize(
        runs,
        settings["scenario"],
        settings.get("env_steps_per_run"),
        is_curriculum=bool(settings.get("curriculum_env")),
        reward_changed=reward_changes(settings.get("env")),
    )
    if settings.get("curriculum_env"):  # returns of different levels do not compare: read per level
        levels = curriculum.summarize(runs, settings["curriculum_env"]["curriculum"]["scenarios"], ALPHA)
        stats["curriculum"] = levels
        stats["targets"] = {"curriculum_transparent": curriculum.target(levels)}
        stats["notes"] = [
            *stats["notes"],
            "a curriculum run: the final return and the 90% mark above mix its levels (read `curriculum`: the "
            "level reached, and the final return at the last level)",
        ]
    curves = {
        c: {seed: curves_from_episodes(eps) | run_facts.get(c, {}).get(seed, {}) for seed, eps in runs[c].items()}
        for c in stats["summary"]
    }
    return {"settings": settings, "runs": curves} | stats | {"wall_s": round(wall_s, 1)}


def _write_atomic(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write_result(tmp, json_safe(result))
    os.replace(tmp, path)


# --- the figure ---------------------------------------------------------------------


def _grid_curve(steps: Sequence[float], values: Sequence[float], grid) -> Any:
    """A run's rolling-100 curve on the grid: NaN before its first point, held after its last."""
    import numpy as np

    rolling, w = _rolling(list(values))
    out = np.full(len(grid), np.nan)
    if not rolling:
        return out
    x = np.asarray(steps[w - 1 :], dtype=float)
    y = np.asarray(rolling, dtype=float)
    # Episodes of one iteration share its env-step stamp: keep the last value at each stamp.
    last = np.r_[x[1:] != x[:-1], True]
    x, y = x[last], y[last]
    inside = grid >= x[0]
    out[inside] = np.interp(grid[inside], x, y)
    return out


def figure_title(settings: dict[str, Any]) -> str:
    """The figure's title: the map and budget, and on a second line the settings changed from the defaults."""
    budget = int(settings.get("env_steps_per_run") or 1)
    title = (
        f"{settings.get('scenario', '?')}: learning curves, {budget} env steps per run (mean over seeds, band min..max)"
    )
    changed = [
        f"--{section} {key}={value}"
        for section in ("env", "ppo", "model")
        for key, value in flatten(settings.get(section) or {}).items()
    ]
    if reward_changes(settings.get("env")):
        changed.append("(returns in another reward than the default)")
    return title + ("\n" + " ".join(changed) if changed else "")


def draw_figure(result: dict[str, Any], path: Path) -> None:
    """Rolling-100 return and kill rate against env steps, mean over seeds and min..max band; from the JSON alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    settings = result.get("settings", {})
    budget = float(settings.get("env_steps_per_run") or 1)
    # Runs stop at the end of the iteration that crosses the budget: the grid reaches their last point too.
    end = max(
        [
            budget,
            *(
                max(c["env_steps"])
                for by_seed in result.get("runs", {}).values()
                for c in by_seed.values()
                if c["env_steps"]
            ),
        ]
    )
    grid = np.linspace(0, end, 200)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    for condition, by_seed in result.get("runs", {}).items():
        for ax, key in zip(axes, ("return", "kill"), strict=True):
            stacked = np.array(
                [_grid_curve(c["env_steps"], [float(v) for v in c[key]], grid) for c in by_seed.values()]
            ).reshape(len(by_seed), len(grid))
            covered = np.isfinite(stacked).any(axis=0)
            if not covered.any():
                continue
            mean = np.full(len(grid), np.nan)
            low, high = mean.copy(), mean.copy()
            mean[covered] = np.nanmean(stacked[:, covered], axis=0)
            low[covered] = np.nanmin(stacked[:, covered], axis=0)
            high[covered] = np.nanmax(stacked[:, covered], axis=0)
            (line,) = ax.plot(
                grid,
                mean,
                marker="o" if covered.sum() < 2 else None,  # one point: show it
                label=f"{condition} ({len(by_seed)} seed{'s' if len(by_seed) != 1 else ''})",
            )
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if result.get("chance_return") is not None:
        axes[0].axhline(result["chance_return"], color="grey", linestyle=":", linewidth=1, label="chance")
    axes[0].set_ylabel(f"return (rolling {WINDOW} episodes)")
    axes[1].set_ylabel(f"kill rate (rolling {WINDOW} episodes)")
    axes[1].set_ylim(-0.02, 1.02)
    for ax in axes:
        ax.set_xlabel("env steps")
        ax.set_xlim(0, end)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(figure_title(settings))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


# --- the command --------------------------------------------------------------------


def _culture_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--culture KNOB=VALUE` pairs as a mapping, checked against SimulatedCultureConfig."""
    from spikeloop.bridge.device.program import culture_from_args

    culture_from_args(pairs, None)  # ValueError names a bad knob or value
    import yaml

    return {key.strip(): yaml.safe_load(raw) for key, _, raw in (pair.partition("=") for pair in pairs)}


def _section_overrides(pairs: list[str], scenario: str, section: str) -> dict[str, Any]:
    """`--ppo`/`--model`/`--env KEY=VALUE` pairs as that section of every condition's experiment, checked as it
    would be."""
    from spikeloop.experiments.benchmarks.one_run import run_experiment
    from spikeloop.experiments.schema import ExperimentError, parse_override, set_path

    examples = {
        "ppo": "lr=0.003",
        "model": "encoder_init_concentration=22",
        "env": "reward_settings.end_health_per_hp=0",
    }
    option, example = f"--{section}", examples[section]
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, _ = pair.partition("=")
        key = key.strip()
        # The ppo and model sections are flat; env's reward_settings and feature_settings are dicts of their own.
        if not sep or not key or (section != "env" and "." in key):
            raise ValueError(
                f"{option} {pair[:80]!r}: write KEY=VALUE with a key of the {section} section, e.g. {option} {example}"
            )
        if section == "env" and key.split(".")[0] in ("scenario", "curriculum"):
            raise ValueError(
                f"{option} {pair[:80]!r}: the level is --scenario's or --curriculum's to set, not {option}'s"
            )
        try:
            _, value = parse_override(f"{section}.{pair}")
            set_path(overrides, key, value)
        except ExperimentError as exc:  # its words are --set's: say which option it was
            raise ValueError(f"{option} {pair[:80]!r}: {str(exc).partition(': ')[2]}") from None
    if overrides:  # the schema's own message names a bad key or value (no run has started)
        run_experiment("direct", 0, scenario, source=option, **{section: overrides})  # type: ignore[arg-type]
    return json.loads(json.dumps(overrides))  # tuples as lists, as read back


def _fmt(value: float | None, spec: str) -> str:
    width = spec.split(".")[0]
    return format("-", f">{width}") if value is None else format(value, spec)


def table(result: dict[str, Any]) -> str:
    """A short plain-text table of the summary."""
    lines = [
        f"{'condition':>11}  {'seeds':>5}  {'final return':>12}  {'kill rate':>9}  {'steps to 90%':>12}  "
        f"{'p vs zero':>9}"
    ]
    for condition, s in result["summary"].items():
        lines.append(
            f"{condition:>11}  {s['seeds']:>5}  {_fmt(s['final_return_mean']['pooled'], '12.1f')}  "
            f"{_fmt(s['final_kill_rate']['pooled'], '9.2f')}  "
            f"{_fmt(s['steps_to_90pct_direct']['median'], '12.0f')}  {_fmt(s['p_value_vs_zero'], '9.3g')}"
        )
    lines.append(f"chance return {_fmt(result.get('chance_return'), '.1f')} ({result.get('chance_from')})")
    for condition, s in result["summary"].items():
        if s.get("vs_random"):
            v = s["vs_random"]
            lines.append(
                f"{condition} > random: return p {_fmt(v['p_value'], '.3g')} (Cliff's delta "
                f"{_fmt(v['cliffs_delta'], '+.2f')}), kill rate p {_fmt(v['kill_p_value'], '.3g')}, one-sided"
            )
    vs_sim = result["summary"].get("sim_reference", {}).get("vs_sim")
    if vs_sim:
        lines.append(
            f"sim_reference - sim: return {_fmt(vs_sim['difference_return'], '+.1f')} "
            f"(p {_fmt(vs_sim['p_value'], '.3g')}, Cliff's delta {_fmt(vs_sim['cliffs_delta'], '+.2f')}), kill rate "
            f"{_fmt(vs_sim['difference_kill_rate'], '+.2f')} (p {_fmt(vs_sim['kill_p_value'], '.3g')}), two-sided"
        )
    levels = result.get("curriculum")
    if levels:
        last = len(levels["levels"])
        for condition, c in levels["conditions"].items():
            finals = [v for v in c["final_return_at_last_level"].values() if v is not None]
            lines.append(
                f"{condition:>11}: levels reached {', '.join(map(str, c['level_reached'].values()))}; "
                f"level {last} in {c['reached_last_level']}/{len(c['level_reached'])} seed(s)"
                + (f", final return there {sum(finals) / len(finals):.1f}" if finals else "")
            )
    for condition, d in result.get("drift", {}).items():
        r, k = d["return"], d["kill_rate"]
        lines.append(
            f"{condition} at the end - at {DEFAULT_ENV_STEPS:,}: return {_fmt(r['mean_difference'], '+.1f')} "
            f"(signed-rank p worse {_fmt(r['signed_rank_p_worse'], '.3g')}), kill rate "
            f"{_fmt(k['mean_difference'], '+.3f')} (p worse {_fmt(k['signed_rank_p_worse'], '.3g')}), {d['seeds']} seed(s)"
        )
    for name, target in result.get("targets", {}).items():
        met = {True: "met", False: "NOT met", None: "not read"}[target["met"]]
        lines.append(f"target {name}: {met}" + (f" ({target['reason']})" if target.get("reason") else ""))
    for pair, effect in result.get("feedback_effects", {}).items():
        r = effect["final_return"]
        ci = r["ci95_paired"] or [None, None]
        lines.append(
            f"{pair}: return {_fmt(r['mean_difference'], '.1f')} (95% CI {_fmt(ci[0], '.1f')} .. "
            f"{_fmt(ci[1], '.1f')}), Mann-Whitney p(greater) {_fmt(r['mann_whitney_p_greater'], '.3g')}, "
            f"kill rate {_fmt(effect['kill_rate']['mean_difference'], '.2f')}"
        )
    return "\n".join(lines)


def main(
    argv: list[str] | None = None,
    *,
    name: str = "learning",
    description: str = __doc__,
    default_conditions: Sequence[str] = CONDITIONS,
    default_output: Path = DEFAULT_OUTPUT,
) -> int:
    """Run the benchmark, write its JSON and figure (`bench ablation` runs it with its own defaults)."""
    parser = argparse.ArgumentParser(
        prog=f"spikeloop bench {name}", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", default=SCENARIO, help=f"VizDoom scenario (default {SCENARIO})")
    parser.add_argument(
        "--curriculum",
        type=Path,
        default=None,
        metavar="EXP.yaml",
        help="play the curriculum of this experiment's env section (its levels, thresholds, reward) instead of "
        "--scenario, e.g. experiments/deadly_corridor.yaml; reports the level each run reached and its final "
        "return at the last level",
    )
    parser.add_argument(
        "--conditions",
        nargs="+",
        choices=ALL_CONDITIONS,
        default=list(default_conditions),
        help=f"conditions to run (default: {' '.join(default_conditions)}; sim_reference: the sim culture "
        "stimulated as the reference device does)",
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per condition, K..K+N-1 (default 5)")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=FRESH_FIRST_SEED,
        metavar="K",
        help=f"the first seed (default {FRESH_FIRST_SEED}: held apart from the tuning seeds "
        f"{TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1}, which every setting was chosen on; "
        f"--first-seed 0 repeats the runs committed before the split)",
    )
    parser.add_argument(
        "--env-steps",
        type=int,
        default=DEFAULT_ENV_STEPS,
        help=f"env-step budget per run (default {DEFAULT_ENV_STEPS}: 5 seeds of the 5 conditions take about 40 minutes on 2 cores, 27 with --jobs 2)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"result file (default {default_output}; {default_output.stem}-SCENARIO.json for another scenario)",
    )
    parser.add_argument("--figure", type=Path, default=None, help="figure file (default: the output path with .png)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="skip the (condition, seed) runs the output file already holds (same settings only)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="take the runs of another result file too (same settings only; e.g. conditions run in parallel "
        "into separate files), as if resumed from it (repeatable)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="runs at once, each in a process and Ray session of its own (default 1); the same episodes as one "
        "at a time. One run is about one core's work: on 2 cores --jobs 2 saves about a third (docs/benchmarks.md, "
        '"Side by side in one session"); on a larger machine, not measured, start at half its cores',
    )
    parser.add_argument(
        "--culture",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="set a knob of the simulated culture in every condition that runs one (repeatable; recorded in the "
        "result; `spikeloop device --culture-help` lists the knobs), e.g. --culture dopamine_tau_ms=300",
    )
    parser.add_argument(
        "--ppo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a learner setting (the experiment's ppo section) in every condition (repeatable; recorded in the "
        "result), e.g. --ppo 'lr=[[0, 0.01], [20480, 0.01], [40960, 0.001]]'",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a module setting (the experiment's model section: encoder, decoder, value net) in every condition "
        "(repeatable; recorded in the result), e.g. --model encoder_init_concentration=22",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an env setting (the experiment's env section; dotted inside reward_settings and feature_settings) "
        "in every condition (repeatable; recorded in the result), e.g. --env reward_settings.end_health_per_hp=0",
    )
    args = parser.parse_args(argv)
    try:
        culture = _culture_overrides(args.culture)
        ppo = _section_overrides(args.ppo, args.scenario, "ppo")
        model = _section_overrides(args.model, args.scenario, "model")
        env_overrides = _section_overrides(args.env, args.scenario, "env")
    except ValueError as exc:
        parser.error(str(exc))
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1 (got {args.seeds})")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1 (got {args.jobs})")
    if args.first_seed < 0:
        parser.error(f"--first-seed must be >= 0 (got {args.first_seed})")
    if args.env_steps < MIN_ENV_STEPS:
        parser.error(f"--env-steps must be >= {MIN_ENV_STEPS} (got {args.env_steps}): too few steps for any episode")
    conditions = [c for c in ALL_CONDITIONS if c in set(args.conditions)]
    env = None
    if args.curriculum is not None:
        if args.scenario != SCENARIO:
            parser.error("--curriculum plays its own levels: give --scenario or --curriculum, not both")
        try:
            env = curriculum.load_curriculum_env(args.curriculum)
        except ValueError as exc:
            parser.error(str(exc))
        args.scenario = env["scenario"]
        if env_overrides and reward_changes(deep_merge(env, env_overrides)) != reward_changes(env):
            # The threshold that moves a run to the next level is a return in the file's reward.
            parser.error(
                f"--env {' '.join(args.env)} changes the reward, and the curriculum's threshold is a return in the "
                f"reward of {args.curriculum}: write the reward into a copy of that file and set the threshold in its "
                "units (the copy is what --curriculum takes)"
            )
        if args.output is None:
            args.output = default_output.with_name(f"{default_output.stem}-curriculum-{args.curriculum.stem}.json")
    if args.output is None:
        args.output = (
            default_output
            if args.scenario == SCENARIO
            else default_output.with_name(f"{default_output.stem}-{args.scenario}{default_output.suffix}")
        )
    figure = args.figure or args.output.with_suffix(".png")
    wanted = [str(seed) for seed in range(args.first_seed, args.first_seed + args.seeds)]
    settings = _settings(
        args.scenario,
        conditions,
        args.seeds,
        args.env_steps,
        culture,
        args.first_seed,
        env,
        ppo,
        env_overrides,
        model=model,
    )
    # What each run plays: the curriculum's env section (if any) with --env's settings over it.
    run_env = deep_merge(env or {}, env_overrides) if env_overrides else env

    runs: Runs = {}
    run_facts: dict[str, dict[str, Any]] = {}
    wall_before = 0.0
    sources = ([args.output] if args.resume and args.output.is_file() else []) + list(args.merge)
    held = list(conditions)
    earlier_provenance: list[dict[str, Any]] = []
    for source in sources:
        try:
            existing = json.loads(source.read_text())
            earlier = check_resume(existing, settings)
        except (OSError, ValueError) as exc:
            parser.error(f"{source}: {exc}")
        earlier_provenance += source_provenance(source, existing)
        facts = run_facts_from_result(existing)
        for condition, by_seed in earlier.items():
            for seed, episodes in by_seed.items():
                if seed in runs.get(condition, {}):
                    parser.error(f"{source}: {condition} seed {seed} is also in an earlier file; merge each run once")
                runs.setdefault(condition, {})[seed] = episodes
                run_facts.setdefault(condition, {})[seed] = facts[condition][seed]
        wall_before += float(existing.get("wall_s") or 0.0)
        # The file keeps every run it held: settings cover the union.
        held += existing["settings"].get("conditions", [])
        print(f"[learning] {source}: {sum(len(v) for v in earlier.values())} run(s) already done", file=sys.stderr)
    mixed = _tuning_mix(runs, wanted)
    if mixed:
        parser.error(mixed)
    if sources:
        held_seeds = sorted({int(s) for by_seed in runs.values() for s in by_seed} | {int(s) for s in wanted})
        held_conditions = [c for c in ALL_CONDITIONS if c in set(held)]
        settings = _settings(
            args.scenario,
            held_conditions,
            len(held_seeds),
            args.env_steps,
            culture,
            min(held_seeds),
            env,
            ppo,
            env_overrides,
            model=model,
        )

    from_sources = {"sources": earlier_provenance} if earlier_provenance else {}

    # Interleaved (for each seed, every condition) so that drift in machine load hits every condition.
    todo = [(c, int(seed)) for seed in wanted for c in conditions if seed not in runs.get(c, {})]
    result: dict[str, Any] | None = None
    t0 = time.monotonic()

    def run_done(condition: str, seed: int, episodes: list[Episode], facts: dict[str, Any]) -> None:
        nonlocal result
        runs.setdefault(condition, {})[str(seed)] = episodes
        run_facts.setdefault(condition, {})[str(seed)] = facts
        result = build_result(settings, runs, run_facts, wall_before + time.monotonic() - t0)
        result |= provenance(name, argv) | from_sources
        _write_atomic(args.output, result)

    try:
        if len(todo) > 1 and args.jobs > 1:
            spec = {"budget": args.env_steps, "scenario": args.scenario, "culture": culture, "env": run_env}
            spec |= {"bench": name, "ppo": ppo, "model": model}
            parallel.run_side_by_side(
                todo, args.jobs, lambda c, s: spec | {"condition": c, "seed": s}, run_done, label=name
            )
        elif todo:
            with private_ray():
                for n, (condition, run_seed) in enumerate(todo, 1):
                    print(f"[{name}] run {n}/{len(todo)}: {condition} seed {run_seed}", file=sys.stderr, flush=True)
                    trained = train_run(
                        condition, run_seed, args.env_steps, args.scenario, culture, run_env, name, ppo, model=model
                    )
                    run_done(condition, run_seed, *trained)
    except (KeyboardInterrupt, parallel.RunFailed) as stop:
        kept = sum(len(by_seed) for by_seed in runs.values()) if args.output.is_file() else 0
        where = (
            f"{kept} finished run(s) are in {args.output}: the same command with --resume goes on"
            if kept
            else "no run had finished, nothing was written"
        )
        if isinstance(stop, parallel.RunFailed):
            raise RuntimeError(f"{stop}; {where}") from None
        print(f"[{name}] stopped; {where}", file=sys.stderr, flush=True)
        raise
    if result is None:  # every run was there already
        result = build_result(settings, runs, run_facts, wall_before) | provenance(name, argv) | from_sources
        _write_atomic(args.output, result)
    draw_figure(result, figure)
    print(table(result))
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"written to {args.output} and {figure}")
    return 0
