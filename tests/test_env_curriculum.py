"""Curriculum: advancing on the mean reward of recent episodes, alone and inside DoomEnv."""

from __future__ import annotations

import pytest

from spikeloop.envs.curriculum import Curriculum
from spikeloop.envs.doom_env import DoomEnv


def test_advances_only_when_the_window_mean_passes_the_threshold():
    curriculum = Curriculum(["basic", "defend_the_center", "deadly_corridor"], threshold=10.0, window_episodes=3)
    assert curriculum.current == "basic" and curriculum.mean_reward() is None
    assert not curriculum.record(100.0)  # window not full yet
    assert not curriculum.record(100.0)
    assert not curriculum.record(-250.0)  # mean -16.7 < 10
    assert not curriculum.record(100.0)  # last 3: 100, -250, 100 -> mean -16.7
    assert not curriculum.record(100.0)  # last 3: -250, 100, 100 -> mean -16.7
    assert curriculum.record(100.0)  # last 3: 100, 100, 100 -> mean 100 >= 10
    assert curriculum.current == "defend_the_center"
    assert curriculum.mean_reward() is None  # the window restarts at each stage


def test_per_stage_thresholds_and_last_stage_is_final():
    curriculum = Curriculum(["a", "b"], threshold=[5.0, 1e9], window_episodes=1)
    assert not curriculum.record(4.0)
    assert curriculum.record(5.0)
    assert curriculum.finished
    assert not curriculum.record(1e12)  # nothing after the last stage
    assert curriculum.current == "b"


def test_bad_curricula_fail():
    with pytest.raises(ValueError, match="at least one"):
        Curriculum([], threshold=0.0)
    with pytest.raises(ValueError, match="2 thresholds for 3 scenarios"):
        Curriculum(["a", "b", "c"], threshold=[1.0, 2.0])


def test_env_switches_scenario_at_reset_after_advancing():
    env = DoomEnv(curriculum={"scenarios": ["basic", "defend_the_center"], "threshold": -1e9, "window_episodes": 1})
    try:
        assert env.scenario.name == "basic"
        env.reset(seed=0)
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, _ = env.step(53)
        assert env.curriculum.current == "defend_the_center"
        _, info = env.reset(seed=0)
        assert info["scenario"] == "defend_the_center" and env.scenario.name == "defend_the_center"
        assert env.observation_space.shape == (59,) and env.action_space.n == 54  # spaces unchanged
        env.step(0)
    finally:
        env.close()
