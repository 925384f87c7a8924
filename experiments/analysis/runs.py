"""Read what runs leave behind: trials, episodes, TensorBoard scalars, the step log, curves.

A run directory (`<output.root_dir>/<name>-<timestamp>/`) holds one trial
directory per trial; each trial directory holds its resolved `experiment.yaml`
(seed, ablation, swept settings, ...), TensorBoard event files, `episodes.jsonl`
and, with `output.step_log`, a `steps/` folder of per-episode `.npz` files. This
module finds trials, reads those files into numpy arrays, groups trials by
ablation and seed, smooths and bands curves, and gives each trial's final
window (the last `FINAL_EPISODES` episodes). Plotting stays in the notebooks and
in `report.py`.
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

from spikeloop.experiments.analysis.stats import Comparison, _check_alternative, compare
from spikeloop.experiments.trial_files import ENDED_SHORT, EPISODES_FILE, FINISHED, STEPS_DIR

RUNS_ENV = "SPIKELOOP_RUNS"
"""Environment variable the notebooks read: run or trial directories, separated by os.pathsep."""
RESOLVED_FILE = "experiment.yaml"
EVENT_GLOB = "events.out.tfevents.*"


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


RESULT_FILE = "result.json"
"""Tune's rows of a trial's reports, one JSON line per iteration (keys: experiments/run_log.py)."""


def why_unfinished(trial: Trial | str | Path) -> str | None:
    """Why the trial has not reached its stop condition, from its last report; None where it has (or cannot tell).

    The trainable's every report carries `finished` (experiments/runner.py): false while the trial runs, and in
    the last report of a run that was stopped or killed; true at the end, where a lost device, a set-up error or a
    learner that got nothing say so with a key of their own. An empty result.json: stopped before its first report
    (its first iteration's episodes may be logged). Trials without result.json or without the key (runs older
    than the key) cannot tell and count as finished.
    """
    path = _path(trial) / RESULT_FILE
    if not path.is_file():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:  # Tune made the file, the trial never reported: stopped in (or before) its first iteration
        return "stopped before its first report"
    try:
        row = json.loads(lines[-1])
    except json.JSONDecodeError:  # a row cut short by a kill
        return "its last report is cut short (the run was killed while writing it)"
    if not isinstance(row, dict) or FINISHED not in row:
        return None
    for key in ENDED_SHORT:
        if row.get(key):
            return f"ended early, {key}: {row[key]}"
    if not row[FINISHED]:
        return f"still running or stopped (last report at iteration {row.get('training_iteration', '?')})"
    return None


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


# --- final window and the ablation comparison ----------------------------------------


def final_return(trial: Trial | str | Path, fraction: float = 0.25, field_name: str = "episode_reward") -> float:
    """Mean return over the last `fraction` of the trial's episodes (at least one); NaN with none."""
    y = episode_arrays(trial, [field_name])[field_name]
    y = y[np.isfinite(y)]
    if not len(y):
        return math.nan
    return float(y[-max(1, int(round(len(y) * fraction))) :].mean())


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


def _path(trial: Trial | str | Path) -> Path:
    return trial.path if isinstance(trial, Trial) else Path(trial)
