"""A trial's row in TensorBoard's HPARAMS tab: its swept settings, its seed and its final figures.

Written with TensorBoard's own hparams summaries (`tensorboard.plugins.hparams.summary_v2`)
through the trial's event writer (run_log.RunLog), so that `tensorboard --logdir RUN_DIR`
shows a sweep as a table and in parallel coordinates:

- at the start of a trial: the experiment's hparams configuration (every key of
  `tune.search_space` with its domain, plus `seed`, and the metrics below) and the
  trial's session (its values of those keys);
- at its end: the final figures as scalars, `final/return_mean` and `final/kill_rate`
  over the trial's last `FINAL_EPISODES` episodes (what `spikeloop analyze` compares).

Every trial of a run writes the same configuration, so whichever TensorBoard reads first
describes them all; point TensorBoard at one run directory for the HPARAMS tab.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tensorboard.compat.proto.summary_pb2 import Summary

from spikeloop.experiments.analysis.sweep import FINAL_EPISODES, final_window, format_value
from spikeloop.experiments.dotted import get_path

FINAL_TAGS = {
    "final/return_mean": f"final return (last {FINAL_EPISODES} episodes)",
    "final/kill_rate": f"kill rate (last {FINAL_EPISODES} episodes)",
}
SEED_KEY = "seed"
Value = bool | float | str


def _value(value: Any) -> Value:
    """A setting as an hparam value: booleans and numbers as they are, anything else as inline YAML text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return value if isinstance(value, str) else format_value(value)


def _domain(spec: dict[str, Any]):
    """The hparams domain of one search-space entry (grid/choice: its values; ranges: an interval)."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    kind, arg = next(iter(spec.items()))
    if kind in ("grid", "choice"):
        values = [_value(v) for v in arg]
        types = {type(v) for v in values}
        return hp.Discrete(values if len(types) == 1 else [str(v) for v in values])
    if kind == "randint":
        return hp.IntInterval(int(arg[0]), int(arg[1]) - 1)
    return hp.RealInterval(float(arg[0]), float(arg[1]))


def _trial_values(experiment) -> dict[str, Value]:
    plain = experiment.plain()
    values = {key: _value(get_path(plain, key)) for key in experiment.tune.search_space}
    values[SEED_KEY] = float(experiment.seed)
    return values


def session_start(experiment, trial_name: str, base_seed: int) -> list[Summary]:
    """The hparams configuration of the run and this trial's session, as summaries to write at step 0."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    values = _trial_values(experiment)
    domains = {key: _domain(spec) for key, spec in experiment.tune.search_space.items()}
    if SEED_KEY not in domains:  # seed k of `tune.seeds` is base_seed + k
        domains[SEED_KEY] = hp.Discrete([float(s) for s in range(base_seed, base_seed + experiment.tune.seeds)])
    for key, domain in domains.items():  # a grid of mixed types is listed as text: so is the trial's value
        if isinstance(domain, hp.Discrete) and domain.dtype is str and not isinstance(values[key], str):
            values[key] = str(values[key])
    metrics = [hp.Metric(tag, display_name=name) for tag, name in FINAL_TAGS.items()]
    if experiment.tune.metric not in FINAL_TAGS:
        metrics.append(hp.Metric(experiment.tune.metric))
    config = hp.hparams_config_pb(hparams=[hp.HParam(key, domain) for key, domain in domains.items()], metrics=metrics)
    return [config, hp.hparams_pb(values, trial_id=trial_name)]


def final_figures(trial_dir: Path) -> dict[str, float]:
    """final/return_mean and final/kill_rate of a trial directory's episodes.jsonl (empty without episodes)."""
    from spikeloop.experiments.analysis.runs import episode_arrays

    arrays = episode_arrays(trial_dir, ["episode_reward", "kill_count"])
    return_mean, kill_rate = final_window(arrays["episode_reward"], arrays["kill_count"] > 0)
    figures = {"final/return_mean": return_mean, "final/kill_rate": kill_rate}
    return {tag: value for tag, value in figures.items() if math.isfinite(value)}
