"""`tune.metric` and `tune.mode` decide which trial is best: a real `spikeloop tune` of two tiny trials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spikeloop.experiments.schema import ExperimentError, load_experiment
from tests.support.spikeloop_cli import run_spikeloop


def test_tune_metric_is_a_run_tag(tmp_path: Path) -> None:
    exp = tmp_path / "e.yaml"
    exp.write_text("tune: {metric: env_runners/episode_return_mean}\n")
    assert load_experiment(exp).tune.metric == "episode/return_mean"  # RLlib's path names the tag read from it
    exp.write_text("tune: {metric: loop/latency_p50_ms, mode: min}\n")
    assert (load_experiment(exp).tune.metric, load_experiment(exp).tune.mode) == ("loop/latency_p50_ms", "min")
    exp.write_text("tune: {metric: episode/retrun_mean}\n")
    with pytest.raises(ExperimentError, match="tune.*unknown metric 'episode/retrun_mean'"):
        load_experiment(exp)


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_tune_ranks_trials_by_the_experiments_metric_and_mode(tmp_path: Path) -> None:
    # Two one-iteration trials of 64 and 128 env steps; ranked by env steps, lowest first, the 64-step one wins
    # (the return, ranked highest first, would pick either).
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "tune",
            "experiments/controls.yaml",
            "--set",
            "policy=direct",
            "--set",
            "stop={iterations: 1}",
            "--set",
            "ppo.minibatch_size=32",
            "--set",
            "ppo.num_epochs=1",
            "--set",
            "tune.search_space={ppo.train_batch_size_per_learner: {grid: [128, 64]}}",
            "--set",
            "tune.max_concurrent_trials=1",
            "--set",
            "tune.metric=episode/env_steps_lifetime",
            "--set",
            "tune.mode=min",
            "--set",
            f"output.root_dir={root}",
        ],
        timeout=500,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (run_dir,) = sorted(root.glob("controls-*"))
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert summary["trials"] == 2 and summary["errored"] == 0
    steps = {}
    for trial in (p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")):
        last = json.loads((trial / "result.json").read_text().splitlines()[-1])
        batch = yaml.safe_load((trial / "experiment.yaml").read_text())["ppo"]["train_batch_size_per_learner"]
        steps[trial] = (last["episode_env_steps_lifetime"], batch)
    best_trial = min(steps, key=lambda t: steps[t][0])
    assert steps[best_trial][1] == 64, steps
    assert summary["best"] == {
        "metric": "episode/env_steps_lifetime",
        "mode": "min",
        "value": steps[best_trial][0],
        "trial_dir": str(best_trial),
    }
    assert Path(summary["best_checkpoint"]).parent == best_trial
