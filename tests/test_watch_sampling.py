"""`spikeloop watch` samples one episode at a time through RLlib's public `sample(num_timesteps=...)`.

Fast (no Ray cluster, no training): a local `SingleAgentEnvRunner` on CartPole with a
seed. It pins the RLlib behaviour `sample_one_episode` (experiments/watch_checkpoint.py)
relies on, so a Ray upgrade that changes it fails here and names the file to fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from spikeloop.experiments.watch_checkpoint import sample_one_episode

FIX = "RLlib's sampling changed: fix experiments/watch_checkpoint.py (sample_one_episode)"


@pytest.fixture(scope="module")
def runner():
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = PPOConfig().environment("CartPole-v1").debugging(seed=7).env_runners(num_env_runners=0)
    env_runner = SingleAgentEnvRunner(config=config)
    yield env_runner
    env_runner.stop()


def first_obs(chunks) -> np.ndarray:
    return np.asarray(chunks[0].get_observations(0))


def test_sample_one_episode_returns_each_step_once_and_ends_done(runner):
    chunks = sample_one_episode(runner, explore=True)
    assert chunks and chunks[-1].is_done, FIX
    assert all(not c.is_done for c in chunks[:-1]), FIX
    ids = {c.id_ for c in chunks}
    assert len(ids) == 1, f"{FIX}: the chunks of one call belong to {len(ids)} episodes"
    assert all(len(c) == 1 for c in chunks), FIX  # one env step per sample() call


def test_later_episodes_do_not_replay_the_seeded_start(runner):
    starts = [first_obs(sample_one_episode(runner, explore=True)) for _ in range(3)]
    assert not np.array_equal(starts[1], starts[2]), f"{FIX}: later episodes restart from the same state"
    assert not any(np.array_equal(starts[0], s) for s in starts[1:]), f"{FIX}: the seeded start is replayed"
