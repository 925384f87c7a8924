"""Stop conditions through `spikeloop train`, as a user sets them: only the conditions the file sets apply.

Each run is the `direct` control (no culture to start, the cheapest trial) with tiny iterations, and the
trial's own `result.json` (one line per iteration) tells where it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.spikeloop_cli import run_spikeloop

TINY = [
    "--set",
    "policy=direct",
    "--set",
    "ppo.train_batch_size_per_learner=64",
    "--set",
    "ppo.minibatch_size=32",
    "--set",
    "ppo.num_epochs=1",
    "--set",
    "checkpoint.every_iterations=100",
]


def _train(tmp_path: Path, stop: str) -> tuple[Path, list[dict]]:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        ["train", "experiments/controls.yaml", *TINY, "--set", f"stop={stop}", "--set", f"output.root_dir={root}"],
        timeout=400,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    (run_dir,) = sorted(root.glob("controls-*"))
    (trial_dir,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    results = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]
    return trial_dir, results


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_env_steps_alone_is_the_stop_condition(tmp_path: Path) -> None:
    # 11 iterations of 64 steps: past the 10 iterations a run without any stop section gets.
    budget = 11 * 64
    _, results = _train(tmp_path, f"{{env_steps: {budget}}}")
    steps = [r["episode_env_steps_lifetime"] for r in results]
    assert len(results) >= 11, steps
    assert steps[-1] >= budget and steps[-2] < budget, steps  # stopped at the first iteration that reached it
    assert results[-1]["finished"] is True


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_stop_after_episodes(tmp_path: Path) -> None:
    # The reference trainer's --max-episodes: finished episodes, checked after each iteration.
    trial_dir, results = _train(tmp_path, "{episodes: 3}")
    logged = [r["episodes_logged"] for r in results]
    assert logged[-1] >= 3, logged
    assert all(n < 3 for n in logged[:-1]), logged  # not one iteration more than needed
    assert results[-1]["finished"] is True
    episodes = [json.loads(line) for line in (trial_dir / "episodes.jsonl").read_text().splitlines() if line.strip()]
    assert len(episodes) == logged[-1]
