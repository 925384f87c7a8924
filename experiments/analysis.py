"""Read what runs leave behind, for the analysis notebooks (notebooks/*.ipynb).

A run directory (`<output.root_dir>/<name>-<timestamp>/`) holds one trial
directory per trial; each trial directory holds its resolved `experiment.yaml`
(seed, ablation, ...), TensorBoard event files, `episodes.jsonl` and, with
`output.step_log`, a `steps/` folder of per-episode `.npz` files. This module
finds trials, reads those files into numpy arrays, groups trials by ablation and
seed, smooths and bands curves, tests the ablation difference and says in plain
words what the test shows. Plotting stays in the notebooks.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bridge.channels import SPIKE_GROUP_NAMES
from experiments.run_log import EPISODES_FILE, STEPS_DIR

RUNS_ENV = "SPIKELOOP_RUNS"
"""Environment variable the notebooks read: run or trial directories, separated by os.pathsep."""
RESOLVED_FILE = "experiment.yaml"
EVENT_GLOB = "events.out.tfevents.*"
N_STIM_CHANNELS = 8
"""The stim vector is [8 frequencies (Hz), 8 amplitudes (uA)]."""
SPIKE_GROUPS = SPIKE_GROUP_NAMES
"""Names of the spike groups, in the order of the logged spike columns."""


@dataclass(frozen=True)
class Trial:
    """One trial directory and the settings that tell it apart from its siblings."""

    path: Path
    name: str
    run: str
    seed: int
    ablation: str
    experiment: dict[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def label(self) -> str:
        """A short legend label: ablation and seed."""
        return f"{self.ablation} / seed {self.seed}"


# --- finding trials --------------------------------------------------------------


def run_dirs_from_env(default: str | Path = "runs") -> list[Path]:
    """The directories named in $SPIKELOOP_RUNS (os.pathsep-separated), else `default`."""
    text = os.environ.get(RUNS_ENV, "").strip()
    parts = [p for p in text.split(os.pathsep) if p.strip()] if text else [str(default)]
    return [Path(p).expanduser() for p in parts]


def _is_trial_dir(path: Path) -> bool:
    return (path / RESOLVED_FILE).is_file() and ((path / EPISODES_FILE).is_file() or any(path.glob(EVENT_GLOB)))


def load_trial(path: str | Path) -> Trial:
    """One trial from its directory (its resolved experiment.yaml gives seed and ablation)."""
    path = Path(path)
    experiment = yaml.safe_load((path / RESOLVED_FILE).read_text()) or {}
    return Trial(
        path=path,
        name=path.name,
        run=path.parent.name,
        seed=int(experiment.get("seed", 0)),
        ablation=str(experiment.get("ablation", "none")),
        experiment=experiment,
    )


def find_trials(paths: str | Path | Iterable[str | Path]) -> list[Trial]:
    """Every trial under the given trial, run or root directories, sorted by ablation, seed and path."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: dict[Path, Trial] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such run directory (set ${RUNS_ENV} to your run directories)")
        candidates = [root] if _is_trial_dir(root) else [p.parent for p in root.rglob(RESOLVED_FILE)]
        for candidate in candidates:
            if _is_trial_dir(candidate):
                found[candidate.resolve()] = load_trial(candidate)
    return sorted(found.values(), key=lambda t: (t.ablation, t.seed, str(t.path)))


def group_trials(trials: Sequence[Trial], key: str = "ablation") -> dict[str, list[Trial]]:
    """Trials by `ablation`, `seed` or `run` (insertion order: the trials' order)."""
    groups: dict[str, list[Trial]] = defaultdict(list)
    for trial in trials:
        groups[str(getattr(trial, key))].append(trial)
    return dict(groups)


# --- episodes.jsonl ----------------------------------------------------------------


def read_episodes(trial: Trial | str | Path) -> list[dict[str, Any]]:
    """The trial's episode records, one dict per line of episodes.jsonl (empty when none yet)."""
    path = _path(trial) / EPISODES_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


ENV_STEPS_AT_END = "env_steps_at_end"
"""Derived episode field: the cumulative episode lengths, i.e. env steps when the episode ended.

Finer than the logged `env_steps_lifetime`, which is the step count at the end of the episode's iteration."""


def episode_arrays(trial: Trial | str | Path, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Numeric episode fields as arrays (NaN where a record lacks one), `env_steps_at_end` too; all by default."""
    records = read_episodes(trial)
    if fields is None:
        fields = [k for k, v in (records[0] if records else {}).items() if _is_number(v)] + [ENV_STEPS_AT_END]
    lengths = np.array([_as_float(r.get("episode_length")) for r in records], dtype=np.float64)
    derived = {ENV_STEPS_AT_END: np.cumsum(np.nan_to_num(lengths))}
    return {
        f: derived[f] if f in derived else np.array([_as_float(r.get(f)) for r in records], dtype=np.float64)
        for f in fields
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: Any) -> float:
    return float(value) if _is_number(value) else math.nan


# --- TensorBoard -------------------------------------------------------------------


def read_scalars(
    trial: Trial | str | Path, tags: Sequence[str] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """TensorBoard scalars by tag: (env steps, values); all tags, or those of `tags` the trial logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(_path(trial)), size_guidance={"scalars": 0})
    accumulator.Reload()
    available = accumulator.Tags().get("scalars", [])
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for tag in available if tags is None else [t for t in tags if t in available]:
        events = accumulator.Scalars(tag)
        out[tag] = (
            np.array([e.step for e in events], dtype=np.int64),
            np.array([e.value for e in events], dtype=np.float64),
        )
    return out


# --- the step log ------------------------------------------------------------------


def step_files(trial: Trial | str | Path) -> list[Path]:
    """The trial's per-episode step-log files, in episode order."""
    return sorted((_path(trial) / STEPS_DIR).glob("episode_*.npz"))


def read_steps(trial: Trial | str | Path) -> dict[str, np.ndarray]:
    """The whole step log, episodes concatenated, plus `episode_index` per step; empty when not logged."""
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for path in step_files(trial):
        index = int(path.stem.split("_")[-1])
        with np.load(path) as data:
            n = len(data["reward"])
            for key in data.files:
                parts[key].append(data[key])
        parts["episode_index"].append(np.full(n, index, dtype=np.int64))
    return {key: np.concatenate(values) for key, values in parts.items()}


def latencies_ms(trial: Trial | str | Path) -> tuple[np.ndarray, str]:
    """Exchange latencies (ms) and where they came from: the step log per step, else TensorBoard p50/p99/max."""
    steps = read_steps(trial)
    latency = steps.get("latency_ms")
    if latency is not None and np.isfinite(latency).any():
        return latency[np.isfinite(latency)], "step log (one value per exchange)"
    scalars = read_scalars(trial, ["loop/latency_p50_ms", "loop/latency_p99_ms", "loop/latency_max_ms"])
    values = [v for _, v in scalars.values()]
    return (np.concatenate(values) if values else np.array([])), "TensorBoard loop/latency_* (per iteration)"


# --- curves ------------------------------------------------------------------------


def smooth(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` values (shorter at the start), NaNs ignored."""
    y = np.asarray(values, dtype=np.float64)
    out = np.full(len(y), np.nan)
    for i in range(len(y)):
        chunk = y[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        if len(chunk):
            out[i] = chunk.mean()
    return out


def default_window(n: int) -> int:
    """A smoothing window that suits `n` points: about a fifth of them, 1 to 50."""
    return int(max(1, min(50, n // 5)))


@dataclass(frozen=True)
class Band:
    """Seeds on a shared x grid: the mean curve, a spread band and how many seeds cover each point."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray


def seed_band(curves: Sequence[tuple[np.ndarray, np.ndarray]], points: int = 200) -> Band:
    """Mean and min..max (one seed: the curve itself) of (x, y) curves interpolated onto a shared grid."""
    curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not curves:
        empty = np.array([])
        return Band(empty, empty, empty, empty, np.array([], dtype=int))
    lo = min(x.min() for x, _ in curves)
    hi = max(x.max() for x, _ in curves)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    stacked = np.full((len(curves), len(grid)), np.nan)
    for row, (x, y) in enumerate(curves):
        order = np.argsort(x)
        inside = (grid >= x.min()) & (grid <= x.max())
        stacked[row, inside] = np.interp(grid[inside], x[order], y[order])
    n = np.isfinite(stacked).sum(axis=0)
    with np.errstate(all="ignore"):
        mean = np.nanmean(np.where(n > 0, stacked, 0.0), axis=0) if n.all() else _nan_reduce(np.nanmean, stacked)
    return Band(grid, mean, _nan_reduce(np.nanmin, stacked), _nan_reduce(np.nanmax, stacked), n)


def _nan_reduce(fn, stacked: np.ndarray) -> np.ndarray:
    out = np.full(stacked.shape[1], np.nan)
    covered = np.isfinite(stacked).any(axis=0)
    out[covered] = fn(stacked[:, covered], axis=0)
    return out


def episode_curve(
    trial: Trial | str | Path, field_name: str = "episode_reward", x: str = "episode_index", window: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(x, smoothed field) of one trial's episodes; x is `episode_index` or `env_steps_at_end`."""
    arrays = episode_arrays(trial, [x, field_name])
    y = arrays[field_name]
    return arrays[x], smooth(y, window or default_window(len(y)))


# --- the ablation comparison -------------------------------------------------------


def final_return(trial: Trial | str | Path, fraction: float = 0.25, field_name: str = "episode_reward") -> float:
    """Mean return over the last `fraction` of the trial's episodes (at least one); NaN with none."""
    y = episode_arrays(trial, [field_name])[field_name]
    y = y[np.isfinite(y)]
    if not len(y):
        return math.nan
    return float(y[-max(1, int(round(len(y) * fraction))) :].mean())


ALTERNATIVES = ("greater", "two-sided")
"""Hypotheses `compare` tests: "greater" (one-sided: group a scores higher than b) or "two-sided"."""


def _check_alternative(alternative: str) -> str:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(map(repr, ALTERNATIVES))}, not {alternative!r}")
    return alternative


@dataclass(frozen=True)
class Comparison:
    """Final-window returns of two groups of seeds, the test of their difference and its effect size.

    The test that decides (`mann_whitney_p`) is the Mann-Whitney U test: it assumes no normality
    of the per-seed returns, and with no ties its p-value is exact, so it stays valid at the
    handful of seeds a run affords. Welch's t-test (`welch_p`, same alternative) is reported
    alongside as a secondary figure only: at a few seeds its normality assumption cannot be
    checked, and it can give small p-values that the data do not support.
    """

    name_a: str
    name_b: str
    a: np.ndarray
    b: np.ndarray
    welch_p: float
    mann_whitney_p: float
    alternative: str = "greater"
    cliffs_delta: float = math.nan
    """P(a > b) - P(a < b) over all seed pairs, in [-1, 1]; = 2U/(n_a n_b) - 1 with U the Mann-Whitney U of a."""

    @property
    def difference(self) -> float:
        """Mean of a minus mean of b."""
        return float(np.mean(self.a) - np.mean(self.b)) if len(self.a) and len(self.b) else math.nan


def cliffs_delta(a: Sequence[float], b: Sequence[float]) -> float:
    """Cliff's delta of a over b: (pairs with a > b - pairs with a < b) / (n_a n_b); NaN when a side is empty."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not len(a) or not len(b):
        return math.nan
    return float(np.sign(a[:, None] - b[None, :]).mean())


def compare(
    name_a: str, returns_a: Sequence[float], name_b: str, returns_b: Sequence[float], alternative: str = "greater"
) -> Comparison:
    """Mann-Whitney U (the test that decides) and Welch's t-test on per-seed final returns, plus Cliff's delta.

    `alternative="greater"` tests the one-sided hypothesis that group a scores higher than
    group b; "two-sided" tests for a difference either way. Mann-Whitney uses the exact null
    distribution when no two returns tie, else the normal approximation with tie correction.
    Non-finite returns are dropped. A p-value is NaN where its test cannot run: Mann-Whitney
    with an empty side, Welch with under 2 seeds a side; both are 1.0 when every return is equal.
    """
    from scipy import stats

    _check_alternative(alternative)
    a = np.asarray([r for r in returns_a if math.isfinite(r)], dtype=np.float64)
    b = np.asarray([r for r in returns_b if math.isfinite(r)], dtype=np.float64)
    welch = mwu = math.nan
    if len(a) and len(b):
        pooled = np.concatenate([a, b])
        if np.ptp(pooled) == 0:
            welch = mwu = 1.0
        else:
            method = "exact" if len(np.unique(pooled)) == len(pooled) else "asymptotic"
            mwu = float(stats.mannwhitneyu(a, b, alternative=alternative, method=method).pvalue)
            if len(a) >= 2 and len(b) >= 2:
                welch = float(stats.ttest_ind(a, b, equal_var=False, alternative=alternative).pvalue)
    return Comparison(name_a, name_b, a, b, welch, mwu, alternative, cliffs_delta(a, b))


def compare_ablations(
    trials: Sequence[Trial], baseline: str = "none", fraction: float = 0.25, alternative: str = "greater"
) -> list[Comparison]:
    """The baseline group (the culture's real answer) against every other ablation group.

    By default one-sided: the hypothesis is that the baseline scores higher than the ablation.
    """
    _check_alternative(alternative)
    groups = group_trials(trials, "ablation")
    base = [final_return(t, fraction) for t in groups.get(baseline, [])]
    return [
        compare(baseline, base, name, [final_return(t, fraction) for t in members], alternative)
        for name, members in groups.items()
        if name != baseline
    ]


def smallest_p(n_a: int, n_b: int, alternative: str = "greater") -> float:
    """The smallest p the exact Mann-Whitney test can give with n_a vs n_b seeds (at complete separation).

    One-sided: 1 / C(n_a + n_b, n_a), the chance of one particular ordering of the ranks; two-sided: twice that.
    """
    sides = 2 if _check_alternative(alternative) == "two-sided" else 1
    if n_a < 1 or n_b < 1:
        return math.nan
    return min(1.0, sides / math.comb(n_a + n_b, n_a))


def min_seeds_per_group(alpha: float = 0.05, alternative: str = "greater") -> int:
    """The fewest seeds per group with which the exact Mann-Whitney test can reach p < alpha.

    n vs n seeds can give at best p = 1 / C(2n, n) one-sided (2 / C(2n, n) two-sided), when
    every seed of one group beats every seed of the other. With fewer seeds no outcome of the
    runs could be significant, so a test would only ever say "no difference". For example:
    alpha 0.05 one-sided -> 4 (1/70; 3 seeds give 1/20 = 0.05, not below), alpha 0.01
    one-sided -> 5 (1/252), alpha 0.05 two-sided -> 4 (2/70).
    """
    _check_alternative(alternative)
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], not {alpha!r}")
    n = 1
    while smallest_p(n, n, alternative) >= alpha:
        n += 1
    return n


MIN_SEEDS_FOR_A_CLAIM = min_seeds_per_group(0.05, "greater")
"""Seeds per group the verdict needs at alpha 0.05, one-sided (4); fewer and it claims nothing, whatever the p."""


def verdict(comparison: Comparison, alpha: float = 0.05) -> str:
    """One plain sentence on what the comparison shows, erring towards "no evidence".

    Decided by the Mann-Whitney p alone (see `Comparison`); with fewer seeds a side than
    `min_seeds_per_group(alpha, comparison.alternative)` it claims nothing.
    """
    c = comparison
    n_a, n_b = len(c.a), len(c.b)
    sided = "one-sided" if c.alternative == "greater" else "two-sided"
    means = (
        f"final-window return {c.name_a} {np.mean(c.a):.2f} vs {c.name_b} {np.mean(c.b):.2f}"
        if n_a and n_b
        else "no finished episodes on one side"
    )
    needed = min_seeds_per_group(alpha, c.alternative)
    if min(n_a, n_b) < needed:
        best = smallest_p(n_a, n_b, c.alternative)
        reach = (
            f"the smallest p an exact {sided} Mann-Whitney test can give with {n_a} vs {n_b} seeds is "
            f"{best:.3g}, not below alpha={alpha:g}"
            if n_a and n_b
            else "there is nothing to test"
        )
        return (
            f"{c.name_a} vs {c.name_b}: no evidence either way — {n_a} vs {n_b} seed(s); at least {needed} "
            f"per group are needed ({needed} vs {needed} can reach p={smallest_p(needed, needed, c.alternative):.3g}"
            f" < {alpha:g}), and {reach} ({means})."
        )
    tests = (
        f"Cliff's delta {c.cliffs_delta:+.2f}; Mann-Whitney {sided} p={c.mann_whitney_p:.3g}, "
        f"Welch {sided} p={c.welch_p:.3g}; {n_a} vs {n_b} seeds"
    )
    if c.mann_whitney_p < alpha:
        if c.alternative == "greater":
            return f"{c.name_a} vs {c.name_b}: {c.name_a} scores higher than {c.name_b} ({means}; {tests})."
        higher, lower = (c.name_a, c.name_b) if c.cliffs_delta > 0 else (c.name_b, c.name_a)
        return f"{c.name_a} vs {c.name_b}: {higher} scores higher than {lower} ({means}; {tests})."
    direction = f" in the direction tested, {c.name_a} higher than {c.name_b}" if c.alternative == "greater" else ""
    return f"{c.name_a} vs {c.name_b}: no evidence of a difference{direction} ({means}; {tests})."


# --- culture response --------------------------------------------------------------


def split_stim(stim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N, 16] stimulation -> (frequencies Hz [N, 8], amplitudes uA [N, 8])."""
    stim = np.asarray(stim, dtype=np.float64)
    half = stim.shape[1] // 2
    return stim[:, :half], stim[:, half:]


def binned_response(values: np.ndarray, spikes: np.ndarray, bins: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Mean spike count per group in equal-width bins of each channel's value.

    values [N, C] (one stim parameter per encoding channel), spikes [N, G] ->
    (bin edges [C, bins + 1], mean counts [C, bins, G], NaN in empty bins).
    """
    values = np.asarray(values, dtype=np.float64)
    spikes = np.asarray(spikes, dtype=np.float64)
    n_channels, n_groups = values.shape[1], spikes.shape[1]
    edges = np.zeros((n_channels, bins + 1))
    means = np.full((n_channels, bins, n_groups), np.nan)
    for c in range(n_channels):
        lo, hi = float(values[:, c].min()), float(values[:, c].max())
        edges[c] = np.linspace(lo, hi if hi > lo else lo + 1e-9, bins + 1)
        which = np.clip(np.digitize(values[:, c], edges[c][1:-1]), 0, bins - 1)
        for b in range(bins):
            rows = which == b
            if rows.any():
                means[c, b] = spikes[rows].mean(axis=0)
    return edges, means


def correlation_map(stim: np.ndarray, spikes: np.ndarray) -> np.ndarray:
    """Pearson r of every stim parameter with every spike group: [16, G] (NaN where one side is constant)."""
    x = np.asarray(stim, dtype=np.float64)
    y = np.asarray(spikes, dtype=np.float64)
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    norm = np.outer(np.sqrt((xc**2).sum(axis=0)), np.sqrt((yc**2).sum(axis=0)))
    with np.errstate(all="ignore"):
        r = (xc.T @ yc) / norm
    return np.where(norm > 0, r, np.nan)


def regression_map(stim: np.ndarray, spikes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares spikes ~ standardised stim: (coefficients [16, G] in spikes per s.d., R^2 per group [G])."""
    x = np.asarray(stim, dtype=np.float64)
    y = np.asarray(spikes, dtype=np.float64)
    sd = x.std(axis=0)
    z = np.where(sd > 0, (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0), 0.0)
    design = np.column_stack([np.ones(len(z)), z])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    total = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    with np.errstate(all="ignore"):
        r2 = np.where(total > 0, 1.0 - (residual**2).sum(axis=0) / total, np.nan)
    return coef[1:], r2


def _path(trial: Trial | str | Path) -> Path:
    return trial.path if isinstance(trial, Trial) else Path(trial)
