"""One PPO iteration of the whole algorithm: stock env runner + culture connector + closed-loop learner."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import ray  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402

from spikeloop.models.columns import SPIKE_MEAN, SPIKES, STIM  # noqa: E402
from spikeloop.models.ppo_config import ClosedLoopPPOConfig  # noqa: E402
from tests.support.toy_loop import ToyClosedLoopEnv, ToyCultureConnector  # noqa: E402

MID = "default_policy"


@pytest.fixture(scope="module")
def ray_session():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    if started:
        ray.shutdown()


def test_one_training_iteration(ray_session) -> None:
    config = (
        ClosedLoopPPOConfig()
        .environment(ToyClosedLoopEnv)
        .env_runners(num_env_runners=0)
        .closed_loop(culture_connector=lambda env, spaces: ToyCultureConnector(seed=0))
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=2)
    )
    algo = config.build_algo()
    try:
        # What the env runner stores per step: exactly the connector's columns.
        episodes = algo.env_runner.sample(num_timesteps=32, random_actions=False)
        episode = episodes[0]
        assert {Columns.ACTION_LOGP, STIM, SPIKES, SPIKE_MEAN, Columns.VF_PREDS} <= set(episode.extra_model_outputs)
        assert episode.get_extra_model_outputs(STIM).shape == (len(episode), 16)
        assert episode.get_extra_model_outputs(SPIKES).shape == (len(episode), 8)
        assert episode.get_extra_model_outputs(Columns.ACTION_LOGP).shape == (len(episode),)

        # Inference (explore=False): mean stimulation, argmax action.
        greedy = algo.env_runner.sample(num_timesteps=8, random_actions=False, explore=False)
        assert np.isfinite(greedy[0].get_extra_model_outputs(Columns.ACTION_LOGP)).all()

        result = algo.train()
        learner_metrics = result["learners"][MID]
        assert np.isfinite(learner_metrics["total_loss"])
        assert "spike_mean_attack" in learner_metrics

        # The env runner acts with the learner's spike mean after the weight sync.
        learner_mean = algo.learner_group.get_state()["learner"]["rl_module"][MID]["spike_mean"]
        runner_mean = algo.env_runner.module.spike_mean.numpy()
        np.testing.assert_allclose(runner_mean, learner_mean, rtol=1e-6)
        assert np.any(runner_mean != 0)
    finally:
        algo.stop()
