"""Every experiment file in experiments/ builds an RLlib config that can train as shipped.

One shipped file (`cl1.yaml`) runs in full against a paced device program in test_shipped_cl1.py; for all of
them, the config RLlib receives is checked here: each env runner's sample adds up to the learner's batch, and
RLlib waits for a sample at least as long as the sample takes at the device's pace (at 10 steps/s the
hardware files' batches take 100-200 s, and RLlib's default of 60 s trained on nothing), and as long as a
sample can take while the loop still moves (`loop.sample_timeout_s: auto`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spikeloop.experiments.schema import load_experiment
from spikeloop.models.closed_loop.sampling import STEP_ALLOWANCE_S

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SHIPPED = sorted([*EXPERIMENTS.glob("*.yaml"), *(EXPERIMENTS / "validation").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_a_shipped_experiment_waits_for_its_whole_sample(path: Path) -> None:
    experiment = load_experiment(path)
    config = experiment.algorithm_config()
    runners = max(1, config.num_env_runners)
    rollout = config.get_rollout_fragment_length(worker_index=1)
    assert rollout * runners >= config.total_train_batch_size, (rollout, runners, config.total_train_batch_size)

    pace = experiment.sample_pace()
    assert pace.rollout_steps == rollout
    assert experiment.loop.sample_timeout_s == "auto", "shipped files leave the sample timeout to the experiment"
    # Enough for every step to wait out a reply, start an episode and play, on top of the device's own pace.
    worst_step_s = pace.rounds * pace.reply_horizon_s + pace.reset_delay_s + STEP_ALLOWANCE_S
    assert config.sample_timeout_s >= rollout * worst_step_s
    assert config.sample_timeout_s > 2 * pace.nominal_sample_s()
    if any(not d.simulated or d.realtime for d in experiment.devices) and experiment.policy != "direct":
        # Hardware pace: at least the windows of every stimulation.
        assert pace.nominal_sample_s() >= rollout * pace.rounds * 0.1 - 1e-9


def test_a_sample_timeout_shorter_than_the_device_pace_is_refused() -> None:
    from spikeloop.experiments.schema import ExperimentError

    with pytest.raises(ExperimentError, match=r"loop.sample_timeout_s: 60 s is not enough .* 1024 env steps"):
        load_experiment(EXPERIMENTS / "cl1.yaml", ["loop.sample_timeout_s=60"])
    experiment = load_experiment(EXPERIMENTS / "cl1.yaml", ["loop.sample_timeout_s=600"])
    assert experiment.algorithm_config().sample_timeout_s == 600


def test_with_device_loss_wait_rllib_waits_out_max_wait_s_too() -> None:
    """A sample paused for a lost device is the loop paused, not hung: RLlib must not give up on it meanwhile."""
    from spikeloop.experiments.schema import ExperimentError

    cl1 = EXPERIMENTS / "cl1.yaml"
    stop = load_experiment(cl1).algorithm_config().sample_timeout_s
    wait = load_experiment(cl1, ["loop.on_device_loss=wait", "loop.max_wait_s=300"]).algorithm_config()
    assert wait.sample_timeout_s == stop + 300
    with pytest.raises(ExperimentError, match=r"loop.sample_timeout_s: 600 s does not cover loop.max_wait_s \(900 s\)"):
        load_experiment(cl1, ["loop.on_device_loss=wait", "loop.max_wait_s=900", "loop.sample_timeout_s=600"])
    assert load_experiment(cl1, ["loop.on_device_loss=wait", "loop.sample_timeout_s=800"]).loop.max_wait_s == 600
