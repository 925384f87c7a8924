"""One run of the learning benchmark: a condition and seed trained until its env-step budget, episode by episode.

`bench learning` calls it in its own process one run after another, or through `parallel` in a child process
per run (`--jobs N`); this module is what both share, so neither imports the other.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

from spikeloop.experiments.analysis.sweep import FINAL_EPISODES
from spikeloop.experiments.benchmarks.conditions import BASE_EXPERIMENT, experiment_dict
from spikeloop.experiments.benchmarks.curriculum import stage_index

if TYPE_CHECKING:
    from spikeloop.experiments.schema import Experiment

WINDOW = FINAL_EPISODES
"""Episodes in the rolling and final windows (the sweep analysis' final window)."""

Episode = tuple[float, float, bool] | tuple[float, float, bool, int]
"""(env steps at the end of the episode's iteration, return, killed anything[, curriculum level, 0-based])."""


def _progress(condition: str, seed: int, episodes: list[Episode], steps: int, t0: float, bench: str) -> str:
    tail = episodes[-WINDOW:]
    mean = sum(e[1] for e in tail) / len(tail) if tail else math.nan
    kills = sum(e[2] for e in tail) / len(tail) if tail else math.nan
    # A curriculum's episodes carry their level (0-based): show the one being played, since returns change with it.
    level = f", level {tail[-1][3] + 1}" if tail and len(tail[-1]) > 3 else ""
    return (
        f"[{bench}] {condition:>11} seed {seed}: {steps:>7} env steps, {len(episodes):>5} episodes, "
        f"return(last {len(tail)}) {mean:8.1f}, kill rate {kills:.2f}{level}, {time.monotonic() - t0:6.0f} s"
    )


def run_experiment(
    condition: str,
    seed: int,
    scenario: str,
    culture: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    ppo: dict[str, Any] | None = None,
    source: str | None = None,
    model: dict[str, Any] | None = None,
) -> Experiment:
    """The checked experiment one benchmark run trains (arguments as `train_run`'s; `source` names it in errors)."""
    from spikeloop.experiments.schema import experiment_from_dict

    base = (
        BASE_EXPERIMENT
        | ({"sim_device": {"culture": culture}} if culture else {})
        | ({"env": env} if env else {})
        | ({"ppo": ppo} if ppo else {})
        | ({"model": model} if model else {})
    )
    return experiment_from_dict(
        experiment_dict(condition, seed, scenario, base), source=source or f"bench learning {condition}"
    )


def train_run(
    condition: str,
    seed: int,
    budget: int,
    scenario: str,
    culture: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    bench: str = "learning",
    ppo: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> tuple[list[Episode], dict[str, Any]]:
    """Train one condition and seed until `budget` env steps (`culture`: knobs for its sim device; `env`: an env
    section with a curriculum, whose first level is `scenario`; `bench`: the name its progress lines carry; `ppo`:
    learner settings; `model`: module settings); its episodes and run facts."""
    from spikeloop.experiments.runner import _pull_episode_records
    from spikeloop.models.closed_loop.ppo import finish

    stages = (env or {}).get("curriculum", {}).get("scenarios")
    experiment = run_experiment(condition, seed, scenario, culture, env, ppo, model=model)
    t0 = time.monotonic()
    algo = experiment.algorithm_config().build_algo()
    episodes: list[Episode] = []
    steps = iterations = 0
    try:
        while steps < budget:
            result = algo.train()
            iterations += 1
            steps = int(
                result.get("num_env_steps_sampled_lifetime")
                or result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0)
            )
            for record in _pull_episode_records(algo):
                episode = (float(steps), float(record["episode_reward"]), int(record.get("kill_count", 0)) > 0)
                if stages:
                    episode += (stage_index(record.get("scenario"), stages),)
                episodes.append(episode)
            print(_progress(condition, seed, episodes, steps, t0, bench), file=sys.stderr, flush=True)
    finally:
        try:
            finish(algo, reason="benchmark")
        finally:
            algo.stop()
    return episodes, {"iterations": iterations, "env_steps_total": steps, "wall_s": round(time.monotonic() - t0, 1)}
