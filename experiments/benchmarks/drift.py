"""Does a longer run end worse? Each run's final at the default budget against its own final at the end.

Issue 25's target "no drift": at 5 times the default budget on `basic`, `direct`, `transparent` and `sim`
end no worse, in return and in kill rate, than at the default budget. The comparison is within each run:
unpaced runs repeat exactly and the learner does not depend on the budget, so a long run's episodes up to
the iteration at which a default-budget run stops are that run's episodes, and its final there is the
default run's final. Read by `spikeloop bench learning` (`drift` and the target `e_no_drift`).

The rule (fixed before the first 100,000-step run, docs/benchmarks.md): per condition the mean over seeds
of (final at the end - final at the default budget) is >= 0 for the return and for the kill rate, "no
worse" on the point estimate. Beside it, not deciding: a 95% paired t interval and the one-sided exact
signed-rank p that the long run ends worse.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

Final = Callable[[Sequence[tuple]], float]
"""A run's final figure from its episodes (the benchmark's last-window mean of return or kill)."""

DRIFT_CONDITIONS = ("direct", "transparent", "sim")
"""The conditions the target reads."""
BUDGET_FACTOR = 5
"""The target is read at this many times the default budget, or more."""


def default_budget_cut(env_steps: Sequence[float], default_env_steps: int) -> float | None:
    """Env steps of the iteration at which a default-budget run stops: the first recorded value >= the budget."""
    after = [s for s in env_steps if s >= default_env_steps]
    return min(after) if after else None


def _run_finals(
    episodes: Sequence[tuple], default_env_steps: int, final_return: Final, final_kill_rate: Final
) -> dict[str, Any] | None:
    """One run's final return and kill rate at the default budget and at the end (None: it never got there)."""
    cut = default_budget_cut([e[0] for e in episodes], default_env_steps)
    if cut is None:
        return None
    early = [e for e in episodes if e[0] <= cut]
    return {
        "cut_env_steps": cut,
        "return_at_default": final_return(early),
        "return_at_end": final_return(episodes),
        "kill_rate_at_default": final_kill_rate(early),
        "kill_rate_at_end": final_kill_rate(episodes),
    }


def _difference(diffs: list[float]) -> dict[str, Any]:
    """Mean of the per-seed differences, its 95% paired t interval and the exact signed-rank p of "worse"."""
    from spikeloop.experiments.analysis.stats import mean_t_interval, signed_rank_test

    bounds = mean_t_interval(diffs)
    return {
        "mean_difference": statistics.fmean(diffs) if diffs else None,
        "ci95_paired": list(bounds) if bounds else None,
        "signed_rank_p_worse": signed_rank_test(diffs, "less").p if diffs else None,
    }


def read(
    runs: dict[str, dict[str, list[tuple]]], default_env_steps: int, final_return: Final, final_kill_rate: Final
) -> dict[str, Any]:
    """Per condition and seed: finals at the default budget and at the end, and their differences.

    `final_return` and `final_kill_rate` are the benchmark's own finals of a list of episodes (its last window).
    """
    out: dict[str, Any] = {}
    for condition, by_seed in runs.items():
        per_seed = {
            seed: _run_finals(eps, default_env_steps, final_return, final_kill_rate) for seed, eps in by_seed.items()
        }
        done = [f for f in per_seed.values() if f is not None]
        out[condition] = {
            "per_seed": per_seed,
            "seeds": len(done),
            "return": _difference([f["return_at_end"] - f["return_at_default"] for f in done]),
            "kill_rate": _difference([f["kill_rate_at_end"] - f["kill_rate_at_default"] for f in done]),
        }
    return out


def target(drift: dict[str, Any], budget: int | None, default_env_steps: int, min_seeds: int) -> dict[str, Any]:
    """`e_no_drift`: every drift condition ends no worse (mean difference >= 0) in return and in kill rate."""
    wanted = BUDGET_FACTOR * default_env_steps
    result: dict[str, Any] = {
        "description": f"at >= {BUDGET_FACTOR}x the default budget ({wanted:,} env steps), {', '.join(DRIFT_CONDITIONS)} "
        f"each end no worse than at {default_env_steps:,}: mean over seeds of (final at the end - final at the "
        f"default budget) >= 0 for the return and for the kill rate (last episodes of the window), >= {min_seeds} "
        "seeds; the paired interval and the exact signed-rank p of 'worse' are reported, not deciding",
        "env_steps_per_run": budget,
        "conditions": {},
        "met": None,
        "reason": None,
    }
    for condition in DRIFT_CONDITIONS:
        if condition not in drift:
            continue
        d = drift[condition]
        r, k = d["return"]["mean_difference"], d["kill_rate"]["mean_difference"]
        result["conditions"][condition] = {
            "return_mean_difference": r,
            "kill_rate_mean_difference": k,
            "seeds": d["seeds"],
            "met": r is not None and k is not None and r >= 0 and k >= 0,
        }
    missing = [c for c in DRIFT_CONDITIONS if c not in drift]
    few = [c for c, v in result["conditions"].items() if v["seeds"] < min_seeds]
    if budget is None or budget < wanted:
        result["reason"] = (
            f"the budget is {'not recorded' if budget is None else f'{budget:,} env steps'}, under {wanted:,}"
        )
    elif missing:
        result["reason"] = f"{' and '.join(missing)} not run"
    elif few:
        result["reason"] = f"{' and '.join(few)}: fewer than {min_seeds} seeds reached the default budget"
    else:
        result["met"] = all(v["met"] for v in result["conditions"].values())
    return result
