"""A run as configurations x seeds, and each configuration against a baseline.

What `spikeloop analyze` computes, before anything is written (report.py writes it).

Sources:

- a run directory of `spikeloop tune` or `spikeloop train`: the run's `experiment.yaml`
  names the swept keys (`tune.search_space`); a **configuration** is one grid point,
  i.e. the values of the `grid` keys that vary between trials, read from each trial's
  resolved `experiment.yaml`; keys drawn at random (choice, uniform, ...) differ from
  trial to trial and are noise the comparison averages over; the trial's top-level
  `seed` is its seed (`tune.seeds` gives seed k the same value in every configuration).
- a sweep's export (`spikeloop analyze RUN_DIR --export FILE`, e.g. a sweep's record
  committed beside the benchmarks): the same trials as the run directory (configuration,
  seed, every episode's env steps, return and kill), with the run's experiment and
  provenance, in one file small enough to commit; it analyses as the run did.
- a learning benchmark file (`spikeloop bench learning` / `ablation` write
  docs/benchmarks/learning.json, ablation.json): each condition is a configuration of
  one factor, `condition`; seed k is the same RLlib and device seed in every condition,
  so the seeds are paired. The benchmark leaves no run directories, only this file.

Per trial, the **final window** is its last `FINAL_EPISODES` episodes: the mean return
and the kill rate (share of episodes with a kill). Several trials of one configuration
with the same seed (`tune.num_samples` > 1) are averaged into that seed's value.

Comparisons: every configuration against the baseline, per metric. Where both have
exactly the same seeds, the per-seed differences are tested with the exact Wilcoxon
signed-rank test (paired); otherwise the per-seed values with the exact Mann-Whitney
test. Holm's correction runs over all comparisons of one metric. Grids of two or more
factors also get **main effects**: per seed, the mean over every configuration at a
level minus the mean over every configuration at the baseline's level of that factor,
tested the same way (its own Holm family).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spikeloop.experiments.analysis import power, stats
from spikeloop.experiments.analysis.runs import (
    ENV_STEPS_AT_END,
    RESOLVED_FILE,
    Band,
    episode_arrays,
    find_trials,
    seed_band,
    smooth,
    why_unfinished,
)
from spikeloop.experiments.dotted import get_path
from spikeloop.experiments.trial_files import PROVENANCE_FILE, REPEATS_FILE

FINAL_EPISODES = 100
"""Episodes in a trial's final window (the learning benchmark's window too)."""
METRICS = {"final_return": "final return", "final_kill_rate": "kill rate"}
"""Per-trial figures compared, by key: mean return and share of episodes with a kill, over the final window."""
ALPHA = 0.05
BENCH_FACTOR = "condition"
BENCH_BASELINE = "zero"
"""The learning benchmark's own reference condition (chance), the default baseline of its file."""
CURVE_POINTS = 200


def killed(kill_counts: np.ndarray) -> np.ndarray:
    """Per episode: 1.0 with a kill, 0.0 without, NaN where the record has no kill count."""
    return np.where(np.isfinite(kill_counts), (kill_counts > 0).astype(np.float64), np.nan)


def final_window(returns: np.ndarray, kills: np.ndarray) -> tuple[float, float]:
    """(mean return, kill rate) over the last `FINAL_EPISODES` episodes that have a return; NaN without any."""
    returns = np.asarray(returns, dtype=np.float64)
    kills = np.asarray(kills, dtype=np.float64)
    keep = np.flatnonzero(np.isfinite(returns))[-FINAL_EPISODES:]
    if not len(keep):
        return math.nan, math.nan
    return float(returns[keep].mean()), float(np.nanmean(kills[keep])) if np.isfinite(kills[keep]).any() else math.nan


@dataclass
class Unit:
    """One trial (or one benchmark run): a configuration at a seed, and its episodes in order."""

    configuration: tuple[Any, ...]
    seed: int
    returns: np.ndarray
    kills: np.ndarray
    env_steps: np.ndarray
    """Env steps when each episode ended."""
    source: str
    drawn: dict[str, Any] = field(default_factory=dict)
    """Values of the keys drawn at random for this trial."""

    def final(self, metric: str) -> float:
        """The final window's mean return or kill rate (NaN without episodes)."""
        return_mean, kill_rate = final_window(self.returns, self.kills)
        return return_mean if metric == "final_return" else kill_rate

    @property
    def short(self) -> bool:
        """Fewer episodes than the final window: its figures are over all of them."""
        return len(self.returns) < FINAL_EPISODES


@dataclass
class SweepData:
    """A run (or benchmark file) read as factors, levels and units."""

    kind: str
    source: Path
    factors: dict[str, list[Any]]
    """Grid keys that vary between trials -> their levels, in grid order."""
    units: list[Unit]
    drawn_keys: list[str] = field(default_factory=list)
    default_baseline: tuple[Any, ...] = ()
    left_out: dict[str, str] = field(default_factory=dict)
    """Trials left out because they have not reached their stop condition: directory name -> why."""
    repeats: list[dict[str, Any]] = field(default_factory=list)
    """Grid points not run because they repeat another exactly (repeats.json): read as the one they repeat."""

    @property
    def configurations(self) -> list[tuple[Any, ...]]:
        """Every configuration that has trials, in grid order (the first factor varies slowest)."""
        present = {u.configuration for u in self.units}
        grid = itertools.product(*self.factors.values()) if self.factors else iter([()])
        return [c for c in grid if c in present]

    def run_as(self, configuration: tuple[Any, ...]) -> tuple[Any, ...]:
        """The configuration whose trials this one is: itself, or the grid point it repeats (repeats.json)."""
        keys = list(self.factors)
        for repeat in self.repeats:
            if tuple(repeat["configuration"].get(k) for k in keys) == configuration:
                return tuple(repeat["same_as"].get(k) for k in keys)
        return configuration

    def label(self, configuration: tuple[Any, ...]) -> str:
        """`key=value, ...` with the shortest unambiguous key names; `all trials` without factors."""
        if not self.factors:
            return "all trials"
        names = short_names(list(self.factors))
        return ", ".join(f"{names[k]}={format_value(v)}" for k, v in zip(self.factors, configuration, strict=True))


def format_value(value: Any) -> str:
    """A setting's value as YAML writes it inline (true, 0.5, [1, 2], {a: 1})."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").strip()


GENERIC_LEAVES = ("enabled",)
"""Last key parts that name nothing alone (`surprise.enabled`, not `enabled`): a short name keeps their parent."""


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key's shortest trailing part that no other key ends with (and more than a generic leaf)."""
    out = {}
    for key in keys:
        parts = key.split(".")
        longest = len(parts) - 2 if parts[-1] in GENERIC_LEAVES and len(parts) > 1 else len(parts) - 1
        for i in range(longest, -1, -1):
            tail = ".".join(parts[i:])
            if not any(other != key and (other == tail or other.endswith("." + tail)) for other in keys):
                out[key] = tail
                break
        else:
            out[key] = key
    return out


# --- reading ----------------------------------------------------------------------------


def load(source: str | Path, include_unfinished: bool = False) -> SweepData:
    """A run directory (train or tune) or a learning-benchmark JSON file, as configurations x seeds.

    Trials that have not reached their stop condition (running, stopped, failed) are left out and named in
    `left_out`, unless `include_unfinished`: their episodes so far are no final return.
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such run directory or benchmark file")
    if source.is_file():
        if source.suffix != ".json":
            raise ValueError(
                f"{source}: give a run directory (output.root_dir/<name>-<timestamp>), a sweep export "
                "(`spikeloop analyze RUN_DIR --export FILE.json`) or a learning benchmark file (docs/benchmarks/learning.json)"
            )
        return load_export(source) if _is_export(source) else load_benchmark(source)
    return load_run(source, include_unfinished)


def _levels(values: list[Any], order: list[Any]) -> list[Any]:
    """The distinct values, those listed in `order` first and in its order, the rest as first seen."""
    out: list[Any] = []
    for value in [v for v in order if v in values] + values:
        if value not in out:
            out.append(value)
    return out


def load_run(run_dir: Path, include_unfinished: bool = False) -> SweepData:
    """A `spikeloop tune` or `train` run directory (its finished trials, unless `include_unfinished`)."""
    trials = find_trials(run_dir)
    if not trials:
        raise ValueError(
            f"{run_dir}: no trials found (a trial directory holds experiment.yaml and episodes.jsonl or "
            "TensorBoard files); give the run directory that `spikeloop train` or `tune` printed"
        )
    left_out = {} if include_unfinished else {t.name: why for t in trials if (why := why_unfinished(t)) is not None}
    if left_out and len(left_out) == len(trials):
        first = next(iter(left_out.items()))
        raise ValueError(
            f"{run_dir}: none of its {len(trials)} trial(s) has reached its stop condition (e.g. {first[0]}: "
            f"{first[1]}), so there is no final return to compare; analyse it when trials finish, resume a stopped "
            "run (`spikeloop tune EXP --resume`), or add --include-unfinished to read the episodes so far"
        )
    kind = "tune" if len(trials) > 1 else "train"
    trials = [t for t in trials if t.name not in left_out]
    run_file = run_dir / RESOLVED_FILE
    run_experiment = yaml.safe_load(run_file.read_text()) if run_file.is_file() else {}
    if run_experiment is None or not isinstance(run_experiment, dict):
        run_experiment = {}
    if len(trials) == 1 and trials[0].path.resolve() == run_dir.resolve():
        raise ValueError(f"{run_dir} is a trial directory; give its run directory ({run_dir.parent})")
    space = ((run_experiment.get("tune") or {}).get("search_space")) or {}
    seed_keys = [k for k in space if k == "seed" or re.fullmatch(r"devices\.\d+\.seed", k)]  # seeds, not settings
    grid_keys = [k for k, spec in space.items() if isinstance(spec, dict) and "grid" in spec and k not in seed_keys]
    drawn_keys = [k for k in space if k not in grid_keys and k not in seed_keys]
    values: dict[str, list[Any]] = {}
    repeats = _repeats(run_dir)
    for key in grid_keys:
        values[key] = [_value_or_none(t.experiment, key) for t in trials]
    # A grid point not run because it repeats another (repeats.json) still holds its levels.
    seen = {key: found + [r["configuration"].get(key) for r in repeats] for key, found in values.items()}
    factors = {
        key: _levels(found, list(space[key]["grid"]))
        for key, found in seen.items()
        if len({json.dumps(v, sort_keys=True) for v in found}) > 1
    }
    units = []
    for i, trial in enumerate(trials):
        arrays = episode_arrays(trial, ["episode_reward", "kill_count", ENV_STEPS_AT_END])
        units.append(
            Unit(
                configuration=tuple(values[k][i] for k in factors),
                seed=trial.seed,
                returns=arrays["episode_reward"],
                kills=killed(arrays["kill_count"]),
                env_steps=arrays[ENV_STEPS_AT_END],
                source=str(trial.path),
                drawn={k: _value_or_none(trial.experiment, k) for k in drawn_keys},
            )
        )
    units += _repeated_units(units, repeats, list(factors))
    first = tuple(levels[0] for levels in factors.values())
    data = SweepData(kind, run_dir, factors, units, drawn_keys, first, left_out, repeats)
    if first not in data.configurations and data.configurations:
        data.default_baseline = data.configurations[0]
    return data


def _repeats(run_dir: Path) -> list[dict[str, Any]]:
    """The run's grid points not run because they repeat another (`spikeloop tune` wrote them), or none."""
    path = run_dir / REPEATS_FILE
    if not path.is_file():
        return []
    try:
        repeats = json.loads(path.read_text())
        if not isinstance(repeats, list) or not all(
            isinstance(r, dict) and isinstance(r.get("configuration"), dict) and isinstance(r.get("same_as"), dict)
            for r in repeats
        ):
            raise ValueError("expected a list of {configuration, same_as, why}")
    except ValueError as exc:
        raise ValueError(
            f"{path}: unreadable ({exc}); it lists the grid points that repeat another, as `spikeloop tune` "
            "wrote it: restore it from the run's copy, or delete it to analyse only the points that ran"
        ) from None
    return repeats


def _repeated_units(units: list[Unit], repeats: list[dict[str, Any]], keys: list[str]) -> list[Unit]:
    """Each repeated grid point's units: those of the point it repeats, seed by seed, under its own name."""
    out = []
    for repeat in repeats:
        same_as = tuple(repeat["same_as"].get(k) for k in keys)
        configuration = tuple(repeat["configuration"].get(k) for k in keys)
        for unit in units:
            if unit.configuration == same_as:
                out.append(
                    Unit(
                        configuration=configuration,
                        seed=unit.seed,
                        returns=unit.returns,
                        kills=unit.kills,
                        env_steps=unit.env_steps,
                        source=f"{unit.source} (read for a repeat of it: {repeat.get('why', '')})",
                        drawn=unit.drawn,
                    )
                )
    return out


def _value_or_none(experiment: dict[str, Any], key: str) -> Any:
    try:
        return get_path(experiment, key)
    except KeyError:
        return None


EXPORT_KIND = "spikeloop sweep export"
"""The `kind` of a file `export` writes (how `load` tells it from a benchmark file)."""


def _is_export(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False  # load_benchmark says what is wrong with it
    return isinstance(data, dict) and data.get("kind") == EXPORT_KIND


def _floats(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64)]


def export(data: SweepData) -> dict[str, Any]:
    """A run's trials, its experiment and its provenance as one JSON-able record that `load` reads back."""
    run_dir = Path(data.source)
    experiment = yaml.safe_load((run_dir / RESOLVED_FILE).read_text()) if (run_dir / RESOLVED_FILE).is_file() else None
    provenance = None
    if (run_dir / PROVENANCE_FILE).is_file():
        provenance = json.loads((run_dir / PROVENANCE_FILE).read_text())
    return {
        "kind": EXPORT_KIND,
        "run_kind": data.kind,
        "source": str(run_dir),
        "experiment": experiment,
        "provenance": provenance,
        "factors": data.factors,
        "default_baseline": list(data.default_baseline),
        "drawn_keys": data.drawn_keys,
        "left_out": data.left_out,
        "repeats": data.repeats,
        "trials": [
            {
                "configuration": dict(zip(data.factors, unit.configuration, strict=True)),
                "seed": unit.seed,
                "trial": Path(unit.source).name,
                "drawn": unit.drawn,
                "env_steps": _floats(unit.env_steps),
                "return": _floats(unit.returns),
                "kill": _floats(unit.kills),
            }
            for unit in data.units
        ],
    }


def _array(values: list[float | None]) -> np.ndarray:
    return np.asarray([math.nan if v is None else v for v in values], dtype=np.float64)


def load_export(path: Path) -> SweepData:
    """A sweep's export (`export`), as the run directory it came from was read."""
    try:
        data = json.loads(path.read_text())
        factors = {key: list(levels) for key, levels in data["factors"].items()}
        units = [
            Unit(
                configuration=tuple(trial["configuration"][key] for key in factors),
                seed=int(trial["seed"]),
                returns=_array(trial["return"]),
                kills=_array(trial["kill"]),
                env_steps=_array(trial["env_steps"]),
                source=f"{path.name}: {trial['trial']}",
                drawn=dict(trial.get("drawn") or {}),
            )
            for trial in data["trials"]
        ]
        baseline = tuple(data["default_baseline"])
        kind, drawn_keys, left_out = data["run_kind"], list(data["drawn_keys"]), dict(data["left_out"])
        repeats = list(data.get("repeats") or [])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: a damaged sweep export (written by `spikeloop analyze RUN_DIR --export FILE`): "
            f"{type(exc).__name__}: {exc}; export it again from its run directory"
        ) from None
    return SweepData(kind, path, factors, units, drawn_keys, baseline, left_out, repeats)


def load_benchmark(path: Path) -> SweepData:
    """A learning benchmark's JSON (`runs`: condition -> seed -> env_steps, return, kill per episode)."""
    try:
        data = json.loads(path.read_text())
        runs = data["runs"]
        conditions = list(runs)
        units = [
            Unit(
                configuration=(condition,),
                seed=int(seed),
                returns=np.asarray(run["return"], dtype=np.float64),
                kills=np.asarray(run["kill"], dtype=np.float64),
                env_steps=np.asarray(run["env_steps"], dtype=np.float64),
                source=f"{path.name}: {condition} seed {seed}",
            )
            for condition, by_seed in runs.items()
            for seed, run in by_seed.items()
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a learning benchmark file (expected runs: condition -> seed -> "
            f"env_steps/return/kill, as `spikeloop bench learning` writes): {type(exc).__name__}: {exc}"
        ) from None
    baseline = (BENCH_BASELINE,) if BENCH_BASELINE in conditions else (conditions[0],)
    return SweepData("bench learning", path, {BENCH_FACTOR: conditions}, units, [], baseline)


def parse_baseline(data: SweepData, assignments: Sequence[str]) -> tuple[Any, ...]:
    """`--baseline key=value` (repeatable) -> a configuration; keys not given keep the default baseline's level."""
    baseline = list(data.default_baseline)
    keys = list(data.factors)
    names = short_names(keys)
    for text in assignments:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--baseline {text!r}: write KEY=VALUE, e.g. --baseline {_example(data)}")
        matches = [k for k in keys if k == key or names[k] == key or k.endswith("." + key)]
        if len(matches) != 1:
            known = ", ".join(keys) or "(none: every trial has the same settings)"
            raise ValueError(f"--baseline {text!r}: {key!r} is not one swept grid key; the grid keys are {known}")
        index = keys.index(matches[0])
        value = yaml.safe_load(raw) if raw.strip() else ""
        levels = data.factors[matches[0]]
        found = [level for level in levels if level == value or format_value(level) == raw.strip()]
        if not found:
            raise ValueError(
                f"--baseline {text!r}: {matches[0]} has no level {raw.strip()!r}; its levels are "
                f"{', '.join(format_value(v) for v in levels)}"
            )
        baseline[index] = found[0]
    configuration = tuple(baseline)
    if configuration not in data.configurations:
        raise ValueError(f"--baseline: no trials ran {data.label(configuration)}")
    return configuration


def _example(data: SweepData) -> str:
    if not data.factors:
        return "KEY=VALUE"
    key, levels = next(iter(data.factors.items()))
    return f"{short_names(list(data.factors))[key]}={format_value(levels[0])}"


# --- per configuration ------------------------------------------------------------------


def per_seed(data: SweepData, configuration: tuple[Any, ...], metric: str) -> dict[int, float]:
    """seed -> the configuration's final figure at that seed (the mean of its trials with that seed)."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for unit in data.units:
        if unit.configuration == configuration:
            by_seed[unit.seed].append(unit.final(metric))
    return {seed: float(np.nanmean(v)) if np.isfinite(v).any() else math.nan for seed, v in sorted(by_seed.items())}


def curves(data: SweepData, configuration: tuple[Any, ...], metric: str) -> Band:
    """The rolling final-window figure against env steps, banded over seeds (mean, min..max)."""
    series = []
    for unit in data.units:
        if unit.configuration == configuration and len(unit.returns):
            values = unit.returns if metric == "final_return" else unit.kills
            series.append((unit.env_steps, smooth(values, FINAL_EPISODES)))
    return seed_band(series, CURVE_POINTS)


def _summary(values: dict[int, float]) -> dict[str, Any]:
    finite = [v for v in values.values() if math.isfinite(v)]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else None,
        **_interval("ci95", stats.mean_interval(finite)),
        "per_seed": {str(k): _number(v) for k, v in values.items()},
    }


def _number(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _pair(pair: tuple[float, float]) -> list[float | None]:
    return [_number(pair[0]), _number(pair[1])]


def _interval(key: str, interval: tuple[tuple[float, float], str]) -> dict[str, Any]:
    """`key` (the 95% interval) and `key`_method: which interval it is (stats.mean_interval)."""
    bounds, method = interval
    return {key: _pair(bounds), f"{key}_method": method}


# --- comparisons ------------------------------------------------------------------------


def compare_values(values: dict[int, float], base: dict[int, float], alternative: str, paired: bool) -> dict[str, Any]:
    """One configuration's per-seed values against the baseline's: the test, effect sizes, pairing spread.

    paired: values and base hold the same seeds, and seed k of one is seed k of the other.
    """
    if paired and set(values) != set(base):
        raise ValueError("paired comparison needs the same seeds on both sides")
    a = [values[s] for s in sorted(values)]
    b = [base[s] for s in sorted(base)]
    out: dict[str, Any] = {
        "design": "paired" if paired else "unpaired",
        "seeds": [len(a), len(b)],
        "mean_difference": _number(float(np.nanmean(a) - np.nanmean(b))) if a and b else None,
        "cliffs_delta": _number(
            stats.cliffs_delta([x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)])
        ),
    }
    if paired:
        seeds = sorted(values)
        diffs = [_difference(values[s], base[s]) for s in seeds]
        finite = [d for d in diffs if math.isfinite(d)]
        test = stats.signed_rank_test(finite, alternative)
        spread = stats.pairing_spread([values[s] for s in seeds], [base[s] for s in seeds])
        out |= {
            "test": test.name,
            "n": len(finite),
            "differences": {str(s): _number(d) for s, d in zip(seeds, diffs, strict=True)},
            "higher_lower_tied": [sum(d > 0 for d in finite), sum(d < 0 for d in finite), sum(d == 0 for d in finite)],
            **_interval("difference_ci95", stats.mean_interval(finite)),
            "pairing": {
                "sd_paired": _number(spread.sd_paired),
                "sd_unpaired": _number(spread.sd_unpaired),
                "ratio": _number(spread.ratio),
                "correlation": _number(spread.correlation),
            },
            # The most extreme outcome these seeds allow: every seed one way (zeros carry no sign).
            "smallest_p": stats.smallest_signed_rank_p(len(finite), alternative),
        }
    else:
        test = stats.rank_sum_test(a, b, alternative)
        out |= {
            "test": test.name,
            "n": test.n,
            **_interval("difference_ci95", stats.difference_interval(a, b)),
            "smallest_p": _number(test.smallest_p),
        }
    out |= {"statistic": _number(test.statistic), "p": _number(test.p), "exact": test.exact}
    return out


def _difference(a: float, b: float) -> float:
    """a - b, and exactly 0 where the two differ only by float noise (the same episodes summed otherwise)."""
    d = a - b
    return 0.0 if abs(d) <= stats.RELATIVE_TIE * max(abs(a), abs(b)) else d


def _holm_family(rows: list[dict[str, Any]], alpha: float) -> None:
    adjusted = stats.holm([r["p"] if r["p"] is not None else math.nan for r in rows])
    m = sum(1 for r in rows if r["p"] is not None)
    for row, p_holm in zip(rows, adjusted, strict=True):
        row["p_holm"] = _number(p_holm)
        row["family_size"] = m
        row["significant"] = bool(row["p_holm"] is not None and row["p_holm"] < alpha)
        # Holm's first step multiplies the smallest p by the family size: what these seeds could reach at best.
        best = row.get("smallest_p")
        row["smallest_p_holm"] = _number(min(1.0, best * m)) if best is not None else None


def _as_repeat(row: dict[str, Any], twin: dict[str, Any] | None, baseline: str) -> None:
    """A repeat's row takes its twin's Holm figures; one that repeats the baseline (twin None) has none."""
    keys = ("p_holm", "family_size", "significant", "smallest_p_holm")
    if twin is not None and row["repeat_of"] != baseline:
        row.update({k: twin[k] for k in keys})
    else:
        row.update({"p_holm": None, "family_size": 0, "significant": False, "smallest_p_holm": None})


def verdict(row: dict[str, Any], name: str, baseline: str, metric: str, alpha: float) -> str:
    """One sentence that claims no more than the test shows."""
    what = METRICS[metric]
    if row.get("repeat_of") == baseline:
        return f"{name} vs {baseline}: the same experiment (not run; its trials are the baseline's): no test."
    if row.get("repeat_of"):
        return f"{name} vs {baseline}: the same experiment as {row['repeat_of']} (not run; its trials read): as it."
    diff = row["mean_difference"]
    n_text = f"{row['seeds'][0]} vs {row['seeds'][1]} seeds ({row['design']})"
    if row.get("seeds_set_aside"):
        n_text += f"; seeds {', '.join(map(str, row['seeds_set_aside']))} set aside: only one side has them"
    if diff is None or row["p"] is None:
        return f"{name} vs {baseline}: nothing to test ({what}: a side has no finished episodes)."
    lo, hi = row["difference_ci95"]
    method = row.get("difference_ci95_method", "bootstrap")
    interval = f", 95% {method} interval {lo:+.3g} to {hi:+.3g}" if lo is not None else ""
    figures = (
        f"{what} {diff:+.3g}{interval}; {row['test']} p={row['p']:.3g}, Holm p={row['p_holm']:.3g} over "
        f"{row['family_size']}; Cliff's delta {row['cliffs_delta']:+.2f}; {n_text}"
        if row["cliffs_delta"] is not None
        else f"{what} {diff:+.3g}; p={row['p']:.3g}; {n_text}"
    )
    best = row.get("smallest_p_holm")
    if best is not None and best >= alpha:
        return (
            f"{name} vs {baseline}: cannot tell ({figures}). With these seeds the most extreme outcome gives "
            f"p={best:.3g} after Holm, not below alpha={alpha:g}: no result of this design could be significant; "
            "add seeds (tune.seeds)."
        )
    if row["significant"]:
        direction = "higher" if diff > 0 else "lower"
        return f"{name} vs {baseline}: {what} {direction} than the baseline ({figures})."
    return f"{name} vs {baseline}: no evidence of a difference at alpha={alpha:g} ({figures})."


def main_effects(
    data: SweepData, baseline: tuple[Any, ...], metric: str, alternative: str, alpha: float
) -> list[dict[str, Any]]:
    """Each factor's levels against the baseline's level, averaged over every level of the other factors."""
    if len(data.factors) < 2:
        return []
    configurations = data.configurations
    values = {c: per_seed(data, c, metric) for c in configurations}
    common = set.intersection(*(set(v) for v in values.values())) if values else set()
    rows = []
    for index, (key, levels) in enumerate(data.factors.items()):
        reference = baseline[index]
        for level in levels:
            if level == reference:
                continue
            at_level = [c for c in configurations if c[index] == level]
            at_reference = [c for c in configurations if c[index] == reference]
            if not at_level or not at_reference:
                continue
            if common:
                seeds = sorted(common)
                level_means = {s: float(np.nanmean([values[c][s] for c in at_level])) for s in seeds}
                reference_means = {s: float(np.nanmean([values[c][s] for c in at_reference])) for s in seeds}
            else:  # no seed ran every configuration: the pooled per-seed values, unpaired
                level_means = dict(enumerate(x for c in at_level for x in values[c].values()))
                reference_means = dict(enumerate(x for c in at_reference for x in values[c].values()))
            row = compare_values(level_means, reference_means, alternative, paired=bool(common))
            row |= {
                "factor": key,
                "level": level,
                "reference": reference,
                "label": f"{short_names(list(data.factors))[key]}: {format_value(level)} vs {format_value(reference)}",
                "configurations_averaged": [len(at_level), len(at_reference)],
            }
            rows.append(row)
    _holm_family(rows, alpha)
    for row in rows:
        row["verdict"] = verdict(row, row["label"].split(" vs ")[0], format_value(row["reference"]), metric, alpha)
    return rows


def analyze(
    data: SweepData,
    baseline: tuple[Any, ...] | None = None,
    alpha: float = ALPHA,
    alternative: str = "two-sided",
) -> dict[str, Any]:
    """The whole analysis as plain data (what analysis.json holds)."""
    stats._check_side(alternative)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, not {alpha!r}")
    baseline = data.default_baseline if baseline is None else baseline
    configurations = data.configurations
    base_label = data.label(baseline)
    result: dict[str, Any] = {
        "source": str(data.source),
        "kind": data.kind,
        "factors": {k: v for k, v in data.factors.items()},
        "drawn_keys": data.drawn_keys,
        "final_episodes": FINAL_EPISODES,
        "alpha": alpha,
        "alternative": alternative,
        "baseline": base_label,
        "left_out": data.left_out,
        "repeats": data.repeats,
        "configurations": [],
        "comparisons": {},
        "main_effects": {},
        "pairing": {},
        "power": {},
    }
    for configuration in configurations:
        units = [u for u in data.units if u.configuration == configuration]
        entry: dict[str, Any] = {
            "label": data.label(configuration),
            "settings": dict(zip(data.factors, configuration, strict=True)),
            "trials": [u.source for u in units],
            "episodes": {str(u.seed): len(u.returns) for u in units},
            "short_seeds": sorted({str(u.seed) for u in units if u.short}),
        }
        for metric in METRICS:
            entry[metric] = _summary(per_seed(data, configuration, metric))
        if data.drawn_keys:
            entry["drawn"] = {k: [u.drawn.get(k) for u in units] for k in data.drawn_keys}
        result["configurations"].append(entry)
    for metric in METRICS:
        base_values = per_seed(data, baseline, metric)
        rows = []
        for configuration in configurations:
            if configuration == baseline:
                continue
            values = per_seed(data, configuration, metric)
            # Seeds both sides ran are paired; a seed only one side has finished (a sweep that is still running)
            # is set aside rather than turning the whole comparison unpaired. No seed in common: unpaired.
            common = set(values) & set(base_values)
            paired = len(common) >= 2 or (bool(common) and set(values) == set(base_values))
            unmatched = sorted((set(values) | set(base_values)) - common) if paired else []
            if paired:
                row = compare_values(
                    {s: values[s] for s in common}, {s: base_values[s] for s in common}, alternative, paired=True
                )
            else:
                row = compare_values(values, base_values, alternative, paired=False)
            row["seeds_set_aside"] = unmatched
            row["configuration"] = data.label(configuration)
            # A repeat's comparison is its twin's (the same trials): reported, but one test, so not a second
            # member of the Holm family; one that repeats the baseline is no test at all.
            twin = data.run_as(configuration)
            if twin == data.run_as(baseline):
                row["repeat_of"] = base_label
            elif twin != configuration:
                row["repeat_of"] = data.label(twin)
            rows.append(row)
        family = [r for r in rows if "repeat_of" not in r]
        _holm_family(family, alpha)
        by_label = {r["configuration"]: r for r in family}
        for row in rows:
            if "repeat_of" in row:
                _as_repeat(row, by_label.get(row["repeat_of"]), base_label)
            row["verdict"] = verdict(row, row["configuration"], base_label, metric, alpha)
        result["comparisons"][metric] = rows
        result["main_effects"][metric] = main_effects(data, baseline, metric, alternative, alpha)
        result["pairing"][metric] = pooled_pairing(family)  # a repeat would count its twin twice
        result["power"][metric] = power.at_seed_count(
            seeds=min((r["seeds"][0] for r in family), default=0),
            sd_paired=result["pairing"][metric]["sd_paired"],
            sd_unpaired=result["pairing"][metric]["sd_unpaired"],
            alpha=alpha / max(1, len(family)),
            alternative=alternative,
        )
    return result


def pooled_pairing(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread of paired differences against the unpaired one, pooled (root mean variance) over comparisons."""
    paired = [r["pairing"] for r in rows if r.get("pairing") and r["pairing"]["sd_paired"] is not None]
    if not paired:
        return {"comparisons": 0, "sd_paired": None, "sd_unpaired": None, "ratio": None}
    sd_paired = math.sqrt(float(np.mean([p["sd_paired"] ** 2 for p in paired])))
    sd_unpaired = math.sqrt(float(np.mean([p["sd_unpaired"] ** 2 for p in paired])))
    return {
        "comparisons": len(paired),
        "sd_paired": sd_paired,
        "sd_unpaired": sd_unpaired,
        "ratio": sd_paired / sd_unpaired if sd_unpaired > 0 else None,
    }
