"""Every env step of the quickstart is accounted for, whole, across RLlib's sample boundaries.

RLlib cuts an episode that is still going at each sample boundary and hands over its parts separately. With
64-step samples on `basic` (episodes of up to 75 steps) nearly every episode is cut at least once, so a record
built from an episode's last part, or step feedback that skips the step before a boundary, shows at once:

- summary.yaml's accounting adds up: the env runner's steps are those of the finished episodes plus those of the
  episode still going at the stop, and every one of them reached the learner;
- episodes.jsonl adds up to that, each line whole: its step log (stimulation timestamps) has its length, and no
  stimulation is in two episodes or missing;
- every step got its step feedback exactly once (the feedback telemetry's per-iteration counts in TensorBoard),
  except the very last one when it did not end an episode: its feedback would go before a next stimulation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support.spikeloop_cli import run_spikeloop

pytestmark = pytest.mark.slow

BATCH = 64
ITERATIONS = 6


def _scalars(trial_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = []
    for path in sorted(trial_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values += [event.value for event in acc.Scalars(tag)]
    return values


def test_quickstart_episodes_and_step_feedback_account_for_every_step(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            *("--set", f"stop.iterations={ITERATIONS}"),
            *("--set", f"ppo.train_batch_size_per_learner={BATCH}"),
            *("--set", "ppo.minibatch_size=32"),
            *("--set", "output.step_log=true"),
            *("--set", f"output.root_dir={root}"),
        ],
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (run_dir,) = root.glob("quickstart-*")
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    ((trial_name, steps),) = summary["env_steps"].items()
    trial_dir = run_dir / trial_name
    total = ITERATIONS * BATCH

    assert steps["learner_env_steps"] == total == steps["env_steps_taken"], steps
    assert steps["episode_steps_logged"] + steps["unfinished_episode_steps"] == total, steps

    episodes = [json.loads(line) for line in (trial_dir / "episodes.jsonl").read_text().splitlines()]
    lengths = [e["episode_length"] for e in episodes]
    assert sum(lengths) == steps["episode_steps_logged"]
    starts = np.cumsum([0, *lengths[:-1]])  # one env runner: episodes follow each other
    cut = [s // BATCH != (s + n - 1) // BATCH for s, n in zip(starts, lengths, strict=True)]
    assert sum(cut) >= 2, f"too few episodes spanned a sample boundary to test anything: {lengths}"

    stamps = []
    for episode in episodes:
        with np.load(trial_dir / episode["step_log"]) as log:
            assert len(log["stim_timestamp_us"]) == len(log["reward"]) == episode["episode_length"], episode
            assert np.isclose(log["reward"].sum(), episode["episode_reward"], atol=1e-3), episode
            stamps += log["stim_timestamp_us"].tolist()
    assert stamps == sorted(set(stamps)), "a stimulation is logged twice or out of order"

    fed = sum(_scalars(trial_dir, "feedback/step/count"))
    pending = 1 if steps["unfinished_episode_steps"] else 0
    assert fed == total - pending, (fed, total, pending)
