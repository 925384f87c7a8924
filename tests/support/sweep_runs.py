"""Synthetic sweep run directories, written the way a run writes them (no Ray, no game).

Each trial's `experiment.yaml` is a real resolved experiment (the schema's own `to_yaml`, seed k
applied by the runner's `seeded`), its episodes and TensorBoard files come from the run's own
`RunLog`, and the run directory holds the run's experiment with its `tune.search_space`: what
`spikeloop analyze` and TensorBoard's HPARAMS tab read from a real sweep.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spikeloop.experiments.run_log import EPISODES_FILE, RunLog
from spikeloop.experiments.runner import seeded
from spikeloop.experiments.schema import experiment_from_dict, set_path

BASE: dict[str, Any] = {
    "name": "synthetic",
    "seed": 0,
    "devices": [{"device_id": "transparent", "backend": "transparent"}],
    "env": {"scenario": "basic", "reward_settings": {"end_health_per_hp": -5.0, "health_lost_per_hp": -5.0}},
}
Episodes = Callable[[dict[str, Any], int], list[tuple[float, bool]]]
"""(trial's grid values, seed) -> its episodes as (return, killed)."""


def write_sweep(
    run_dir: Path,
    search_space: dict[str, dict[str, Any]],
    seeds: int,
    episodes: Episodes,
    drawn: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
    tensorboard: bool = False,
) -> Path:
    """A run directory with one trial per grid point and seed (seed k = seed + k); `drawn` sets random keys."""
    data = copy.deepcopy(base or BASE)
    data["tune"] = {"search_space": search_space, "seeds": seeds}
    run_dir.mkdir(parents=True)
    (run_dir / "experiment.yaml").write_text(experiment_from_dict(data).to_yaml())
    grid = {k: spec["grid"] for k, spec in search_space.items() if "grid" in spec}
    for index, (values, k) in enumerate(itertools.product(itertools.product(*grid.values()), range(seeds))):
        point = dict(zip(grid, values, strict=True))
        trial_data = copy.deepcopy(data)
        for key, value in (point | (drawn or {})).items():
            set_path(trial_data, key, value)
        experiment = experiment_from_dict(seeded(trial_data, k))
        write_trial(
            run_dir / f"trial_{index:03d}", experiment, episodes(point, experiment.seed), data["seed"], tensorboard
        )
    return run_dir


def write_trial(
    trial_dir: Path, experiment, episodes: list[tuple[float, bool]], base_seed: int = 0, tensorboard: bool = False
) -> Path:
    """One trial: its resolved experiment and episodes.jsonl; with `tensorboard`, through the run's RunLog
    (HPARAMS session, two iterations of scalars, the final figures), else the JSONL lines RunLog would write."""
    trial_dir.mkdir(parents=True)
    (trial_dir / "experiment.yaml").write_text(experiment.to_yaml())
    records = [
        {"episode_reward": reward, "episode_length": 10, "kill_count": int(killed)} for reward, killed in episodes
    ]
    if not tensorboard:
        lines = [
            json.dumps({"episode_index": i, "iteration": 1, "env_steps_lifetime": 10 * len(records)} | record)
            for i, record in enumerate(records, start=1)
        ]
        (trial_dir / EPISODES_FILE).write_text("".join(line + "\n" for line in lines))
        return trial_dir
    log = RunLog(trial_dir)
    log.start_session(experiment, base_seed=base_seed)
    half = len(records) // 2
    for iteration, chunk in enumerate((records[:half], records[half:]), start=1):
        result = {
            "training_iteration": iteration,
            "num_env_steps_sampled_lifetime": 10 * (half if iteration == 1 else len(records)),
            "env_runners": {"episode_return_mean": sum(r["episode_reward"] for r in chunk) / max(1, len(chunk))},
        }
        log.log_iteration(result, chunk)
    log.close()
    return trial_dir
