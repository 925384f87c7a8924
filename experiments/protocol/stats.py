"""The protocol's pre-registered statistics: early against late play, rest before against rest after.

Declared in the experiment before the run (`protocol.early_s`, `late_s`, `rest_block_s`,
`bootstrap_resamples`), computed once at the end of the trial, never chosen after seeing the data.

Early against late play (one culture's learning within its session). An episode belongs to early play if it
lies entirely within the first `early_s` of play, to late play if entirely within the last `late_s` (culture
time: each step is one exchange of the device's windows). Per episode: its return and whether it killed
(the kill rate is the share of episodes that did). For each: late - early of the means, a percentile
bootstrap 95% interval (episodes resampled within each window), and a one-sided exact Mann-Whitney p for
"late episodes score higher". Exact: the p is the permutation distribution of the rank sum given the ties
(returns repeat, kills are 0 or 1), computed in full by dynamic programming over the tied values; only when
that would take too long (`EXACT_WORK_LIMIT`, hundreds of episodes a side) is it estimated from
`MONTE_CARLO_PERMUTATIONS` random permutations, and the result says so (`method`).

Rest before against rest after (did the culture's spontaneous activity change). Per spike group, the mean
count per tick in each rest and after - before, with a 95% interval and a two-sided p from a circular block
bootstrap (blocks of `rest_block_s`), leaving out the first `rest_settle_s` of each rest (play's after-effects
in the rest that follows it; the same span before play, so that both rests are measured alike). Two-sided: a culture that learned may fire more or less at rest, and no
direction was declared. A bootstrap of blocks, not of ticks: successive ticks are not independent (bursts
outlast a 100 ms tick; the lag-1 autocorrelation of each group is reported), and resampling single ticks would
make the interval far too narrow. The p is the interval's own: twice the smaller share of resampled changes
on either side of 0. Eight groups are eight tests: Holm's adjusted p is given beside each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from spikeloop.bridge.wire.channels import SPIKE_GROUP_NAMES
from spikeloop.experiments.analysis import stats as analysis_stats
from spikeloop.experiments.protocol.rest import RestRecord

EXACT_WORK_LIMIT = 2e9
"""Array operations the exact Mann-Whitney may take (about 10 s on one core); beyond, Monte Carlo."""
MONTE_CARLO_PERMUTATIONS = 200_000


# --- tests and intervals -------------------------------------------------------------------------------------


def mann_whitney_greater(
    x: Sequence[float], y: Sequence[float], rng: np.random.Generator, work_limit: float = EXACT_WORK_LIMIT
) -> dict[str, Any]:
    """One-sided Mann-Whitney of "x tends to be larger than y": U of x, p, and how p was computed.

    The null distribution is the permutation distribution of x's rank sum (midranks for ties) over every way
    of picking len(x) of the pooled values: exact, or Monte Carlo when the exact count would take more than
    `work_limit` array operations.
    """
    from scipy.stats import rankdata

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n_x, n_y = len(x), len(y)
    if n_x == 0 or n_y == 0:
        return {"u": None, "p": None, "method": "none: a window has no episode"}
    pooled = np.concatenate([x, y])
    doubled = np.rint(2 * rankdata(pooled)).astype(np.int64)  # midranks are halves: integers when doubled
    observed = int(doubled[:n_x].sum())
    u = observed / 2 - n_x * (n_x + 1) / 2
    if np.ptp(pooled) == 0:
        return {"u": u, "p": 1.0, "method": "exact (all values equal)"}
    # Track the smaller side: x's rank sum is large exactly when y's is small.
    track_x = n_x <= n_y
    m = n_x if track_x else n_y
    values, ties = np.unique(doubled, return_counts=True)
    top = int(np.sort(doubled)[-m:].sum())
    work = float(sum(min(int(t), m) for t in ties)) * (m + 1) * (top + 1)
    target = observed if track_x else int(doubled.sum()) - observed
    if work <= work_limit:
        counts = _rank_sum_counts(values, ties, m, top)
        total = counts.sum()
        if math.isfinite(total) and total > 0:
            tail = counts[target:].sum() if track_x else counts[: target + 1].sum()
            return {"u": u, "p": float(min(1.0, tail / total)), "method": "exact"}
    hits = 0
    batch = 2000
    for start in range(0, MONTE_CARLO_PERMUTATIONS, batch):
        n = min(batch, MONTE_CARLO_PERMUTATIONS - start)
        picks = np.argsort(rng.random((n, len(pooled))), axis=1)[:, :n_x]
        hits += int((doubled[picks].sum(axis=1) >= observed).sum())
    p = (hits + 1) / (MONTE_CARLO_PERMUTATIONS + 1)
    return {"u": u, "p": p, "method": f"Monte Carlo ({MONTE_CARLO_PERMUTATIONS} permutations)"}


def _rank_sum_counts(values: np.ndarray, ties: np.ndarray, m: int, top: int) -> np.ndarray:
    """How many ways each (doubled) rank sum arises when m of the pooled values are picked: [top + 1]."""
    ways = np.zeros((m + 1, top + 1))
    ways[0, 0] = 1.0
    for value, tied in zip(values.tolist(), ties.tolist(), strict=True):
        grown = ways.copy()
        for j in range(1, min(tied, m) + 1):
            shift = j * value
            if shift > top:
                break
            grown[j:, shift:] += math.comb(tied, j) * ways[: m + 1 - j, : top + 1 - shift]
        ways = grown
    return ways[m]


def bootstrap_difference(
    late: Sequence[float], early: Sequence[float], resamples: int, rng: np.random.Generator
) -> dict[str, Any]:
    """Means, late - early and its percentile bootstrap 95% interval (each window resampled on its own)."""
    late, early = np.asarray(late, dtype=np.float64), np.asarray(early, dtype=np.float64)
    if len(late) == 0 or len(early) == 0:
        return {"early_mean": _mean(early), "late_mean": _mean(late), "late_minus_early": None, "ci95": None}
    late_star = late[rng.integers(0, len(late), (resamples, len(late)))].mean(axis=1)
    early_star = early[rng.integers(0, len(early), (resamples, len(early)))].mean(axis=1)
    low, high = np.percentile(late_star - early_star, [2.5, 97.5])
    return {
        "early_mean": float(early.mean()),
        "late_mean": float(late.mean()),
        "late_minus_early": float(late.mean() - early.mean()),
        "ci95": [float(low), float(high)],
    }


def block_means(series: np.ndarray, block: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples, groups] means of circular block-bootstrap resamples of one culture's [ticks, groups] series."""
    ticks = len(series)
    block = max(1, min(block, ticks))
    wrapped = np.concatenate([series, series[: block - 1]]).astype(np.float64)
    sums = np.concatenate([np.zeros((1, series.shape[1])), np.cumsum(wrapped, axis=0)])
    block_sums = sums[block : block + ticks] - sums[:ticks]  # [ticks, groups]: the block starting at each tick
    n_blocks = max(1, ticks // block)
    starts = rng.integers(0, ticks, (resamples, n_blocks))
    return block_sums[starts].sum(axis=1) / (n_blocks * block)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count); the analysis package's `holm`."""
    adjusted = analysis_stats.holm([math.nan if p is None else p for p in pvalues])
    return [None if p is None else a for p, a in zip(pvalues, adjusted, strict=True)]


def lag1_autocorrelation(series: np.ndarray) -> float | None:
    """Lag-1 autocorrelation of a 1-D series (None when it is constant or too short)."""
    if len(series) < 3 or np.ptp(series) == 0:
        return None
    return float(np.corrcoef(series[:-1], series[1:])[0, 1])


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if len(values) else None


# --- the two comparisons ------------------------------------------------------------------------------------


def episode_times(
    episodes: Sequence[dict[str, Any]], step_s: float, unfinished_steps: dict[int, int]
) -> tuple[list[tuple[float, float, dict[str, Any]]], dict[int, float]]:
    """Each episode's (start, end) in its culture's play time, and each culture's play length.

    Episodes of one env runner follow each other in the order of their numbers; play time is their steps
    (one exchange each, `step_s` of culture time) plus the steps of the episode still going at the stop.
    """
    by_runner: dict[int, list[dict[str, Any]]] = {}
    for record in episodes:
        by_runner.setdefault(int(record.get("env_runner") or 0), []).append(record)
    timed = []
    play_s: dict[int, float] = {}
    for runner, records in by_runner.items():
        clock = 0.0
        for record in sorted(records, key=lambda r: r.get("episode", 0)):
            start = clock
            clock += int(record["episode_length"]) * step_s
            timed.append((start, clock, record))
        play_s[runner] = clock + unfinished_steps.get(runner, 0) * step_s
    for runner, steps in unfinished_steps.items():
        play_s.setdefault(runner, steps * step_s)
    return timed, play_s


def early_late(
    episodes: Sequence[dict[str, Any]],
    *,
    step_s: float,
    unfinished_steps: dict[int, int],
    early_s: float,
    late_s: float,
    resamples: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Early against late play: returns and kill rate of the episodes wholly inside each window."""
    timed, play_s = episode_times(episodes, step_s, unfinished_steps)
    runner_of = {id(record): int(record.get("env_runner") or 0) for _, _, record in timed}
    early = [r for start, end, r in timed if end <= early_s + 1e-9]
    late = [r for start, end, r in timed if start >= play_s[runner_of[id(r)]] - late_s - 1e-9]
    out: dict[str, Any] = {
        "play_s": {str(k): round(v, 6) for k, v in sorted(play_s.items())},
        "early": {"window_s": [0.0, early_s], "episodes": len(early)},
        "late": {"window_s": "the last late_s of each culture's play", "late_s": late_s, "episodes": len(late)},
    }
    for name, value in (
        ("return", lambda r: float(r["episode_reward"])),
        ("kill_rate", lambda r: float(int(r.get("kill_count", 0)) > 0)),
    ):
        late_values, early_values = [value(r) for r in late], [value(r) for r in early]
        test = mann_whitney_greater(late_values, early_values, rng)
        out[name] = bootstrap_difference(late_values, early_values, resamples, rng) | {
            "p_one_sided": test["p"],
            "mann_whitney_u": test["u"],
            "method": test["method"],
        }
    return out


def rest_change(
    before: RestRecord,
    after: RestRecord,
    *,
    settle_s: float,
    block_s: float,
    resamples: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Rest before against rest after: mean counts per tick per group, after - before, block bootstrap.

    The first `settle_s` of each rest are left out: right after play the culture still answers its last
    stimulation and feedback (in the simulated culture, bursts of 100+ counts for half a second).
    """
    block = max(1, round(block_s / before.tick_s))
    settle = round(settle_s / before.tick_s)
    names = [*SPIKE_GROUP_NAMES, "total"]

    def answered_series(record: RestRecord, culture: int) -> np.ndarray:
        kept = record.answered[culture].copy()
        kept[:settle] = False
        counts = record.counts[culture][kept].astype(np.float64)
        return np.concatenate([counts, counts.sum(axis=1, keepdims=True)], axis=1)  # the groups, then their total

    cultures = range(min(len(before.counts), len(after.counts)))
    series = {
        "before": [answered_series(before, c) for c in cultures],
        "after": [answered_series(after, c) for c in cultures],
    }
    if any(len(s) < 2 * block for side in series.values() for s in side):
        return {"error": f"a rest has fewer than two blocks of {block} answered ticks: nothing to compare"}
    observed = {side: np.mean([s.mean(axis=0) for s in parts], axis=0) for side, parts in series.items()}
    resampled = {
        side: np.mean([block_means(s, block, resamples, rng) for s in parts], axis=0) for side, parts in series.items()
    }
    changes = resampled["after"] - resampled["before"]  # [resamples, groups + 1]
    groups: dict[str, Any] = {}
    pvalues = []
    for g, name in enumerate(names):
        below, above = int((changes[:, g] <= 0).sum()), int((changes[:, g] >= 0).sum())
        p = min(1.0, 2 * (min(below, above) + 1) / (resamples + 1))
        low, high = np.percentile(changes[:, g], [2.5, 97.5])
        pooled = {side: np.concatenate([s[:, g] for s in parts]) for side, parts in series.items()}
        groups[name] = {
            "before_mean": float(observed["before"][g]),
            "after_mean": float(observed["after"][g]),
            "change": float(observed["after"][g] - observed["before"][g]),
            "ci95": [float(low), float(high)],
            "p_two_sided": p,
            "lag1_autocorrelation": {side: lag1_autocorrelation(pooled[side]) for side in ("before", "after")},
        }
        if name != "total":
            pvalues.append(p)
    for name, adjusted in zip(SPIKE_GROUP_NAMES, holm(pvalues), strict=True):
        groups[name]["p_holm"] = adjusted
    return {
        "unit": "spike counts per tick (one collection window)",
        "settle_ticks": settle,
        "block_ticks": block,
        "ticks_answered": {side: [len(s) for s in parts] for side, parts in series.items()},
        "groups": groups,
    }
