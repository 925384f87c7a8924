"""The running normalisation of observation features (models/feature_norm.py) and the encoder it feeds."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.feature_norm import FeatureNormalizer


def normalizer(**kwargs) -> FeatureNormalizer:
    settings = {"enabled": True, "momentum": 0.5, "std_floor": 0.05, "clip": 5.0} | kwargs
    return FeatureNormalizer(3, **settings)


def test_identity_until_the_first_batch_is_committed() -> None:
    norm = normalizer()
    x = torch.tensor([[0.3, -0.2, 0.9]])
    torch.testing.assert_close(norm(x), x)
    norm.stage(torch.tensor([[1.0, 0.0, 0.5], [3.0, 0.0, 0.5]]))
    torch.testing.assert_close(norm(x), x)  # staged, not yet committed: the loss sees what acting saw


def test_commit_sets_then_averages_the_statistics() -> None:
    norm = normalizer()
    norm.stage(torch.tensor([[1.0, 0.0, 0.5], [3.0, 0.0, 0.5]]))
    norm.commit()
    torch.testing.assert_close(norm.mean, torch.tensor([2.0, 0.0, 0.5]))
    # std 1 for the first feature; the constant ones stay at the floor instead of dividing by zero.
    torch.testing.assert_close(norm.std(), torch.tensor([1.0, 0.05, 0.05]))
    torch.testing.assert_close(norm(torch.tensor([[4.0, 0.01, 10.0]])), torch.tensor([[2.0, 0.2, 5.0]]))  # clipped
    norm.commit()  # nothing staged: nothing changes
    torch.testing.assert_close(norm.mean, torch.tensor([2.0, 0.0, 0.5]))
    norm.stage(torch.zeros(4, 3))
    norm.commit()
    torch.testing.assert_close(norm.mean, torch.tensor([1.0, 0.0, 0.25]))  # momentum 0.5
    assert norm.count.item() == 6


def test_disabled_is_the_identity() -> None:
    norm = normalizer(enabled=False)
    norm.stage(torch.randn(10, 3) * 7)
    norm.commit()
    x = torch.randn(4, 3)
    torch.testing.assert_close(norm(x), x)
    assert norm.count.item() == 0


def test_statistics_are_module_state() -> None:
    space = gym.spaces.Box(-1.0, 1.0, (59,), np.float32)
    module = ClosedLoopRLModule(observation_space=space, action_space=gym.spaces.Discrete(54), model_config={})
    module.feature_norm.stage(torch.rand(16, 59))
    module.feature_norm.commit()
    state = module.get_state()
    assert {"feature_norm.mean", "feature_norm.sq_mean", "feature_norm.count"} <= set(state)
    assert not any("_staged" in key for key in state)


def test_the_first_stimulation_depends_on_the_observation() -> None:
    """At init, the encoder's modes move with the observation by more than its Beta noise."""
    space = gym.spaces.Box(-1.0, 1.0, (59,), np.float32)
    torch.manual_seed(0)
    module = ClosedLoopRLModule(observation_space=space, action_space=gym.spaces.Discrete(54), model_config={})
    obs = torch.rand(512, 59) * 0.2 - 0.1  # features that vary little, as most do in a scenario
    module.feature_norm.stage(obs)
    module.feature_norm.commit()
    with torch.no_grad():
        dist = module.encoder_distribution(module._forward({"obs": obs})["stim_dist_inputs"])
        modes_unit = (dist.alpha - 1) / (dist.alpha + dist.beta - 2)
        noise_unit = torch.distributions.Beta(dist.alpha, dist.beta).stddev
    assert modes_unit.std(0).mean() > noise_unit.mean(), (modes_unit.std(0).mean(), noise_unit.mean())
